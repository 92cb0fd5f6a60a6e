package netdev

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/crash"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices"

	"github.com/carve-dra/carve/slices/names"
)

// Prepare creates the share's interface on the parent (left down, in the
// node's namespace: the pod's does not exist yet), gives it its addresses,
// holds its bandwidth with HTB classes chosen by the BPF classifier, and
// returns the CDI hook that moves it into the pod.
func (p *NICPreparer) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.NIC == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not a NIC", a.Device)
	}
	cfg, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("config: %w", err)
	}
	net1 := v1alpha1.NetworkConfig{}
	if cfg.Network != nil {
		net1 = *cfg.Network
	}
	key := a.ShareKey()
	u := undoRecord{Parent: dev.NIC.Name, Link: LinkName(key), MAC: ShareMAC(key).String(), VLAN: net1.VLAN}
	// Counted before anything is made: a parent at its limit refuses the
	// share with nothing to undo.
	added, err := p.holdShare(dev.NIC.Name, key, p.shareLimit(dev))
	if err != nil {
		return prepare.Prepared{}, err
	}
	p.preparing.Add(1)
	defer p.preparing.Add(-1)
	leave, err := p.gate.enter(ctx)
	if err != nil {
		if added {
			p.releaseShare(key)
		}
		return prepare.Prepared{}, err
	}
	defer leave()
	// The same share unprepared a moment ago (a claim used again on this
	// node) has the same names: what is left of it goes first.
	if err := p.reaper.settle(key); err != nil {
		if added {
			p.releaseShare(key)
		}
		return prepare.Prepared{}, err
	}
	prepared, err := p.prepare(ctx, a, dev, net1, key, &u)
	if err != nil {
		raw, _ := json.Marshal(u)
		if uerr := p.unprepare(ctx, a, raw); uerr != nil {
			err = fmt.Errorf("%w (and undoing: %v)", err, uerr)
		} else if uerr := p.reaper.settle(key); uerr != nil {
			// Queued on disk: the reaper tries again.
			err = fmt.Errorf("%w (and undoing: %v)", err, uerr)
		}
		return prepare.Prepared{}, err
	}
	return prepared, nil
}

func (p *NICPreparer) prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry, cfg v1alpha1.NetworkConfig, key string, u *undoRecord) (prepare.Prepared, error) {
	logger := klog.FromContext(ctx)
	parent, err := p.h.LinkByName(dev.NIC.Name)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("parent %s: %w", dev.NIC.Name, err)
	}
	if parent.Attrs().OperState != netlink.OperUp && parent.Attrs().OperState != netlink.OperUnknown {
		return prepare.Prepared{}, fmt.Errorf("parent %s has no usable link (%s)", dev.NIC.Name, parent.Attrs().OperState)
	}
	mtu := parent.Attrs().MTU
	if cfg.MTU != 0 {
		if cfg.MTU > mtu {
			return prepare.Prepared{}, fmt.Errorf("mtu %d is larger than the parent %s's %d", cfg.MTU, dev.NIC.Name, mtu)
		}
		mtu = cfg.MTU
	}
	egress, ingress := bandwidth(a, names.CapEgressBandwidth), bandwidth(a, names.CapIngressBandwidth)
	if (egress > 0 || ingress > 0) && p.opts.Shaper == nil {
		return prepare.Prepared{}, errors.New("this agent has no BPF classifier, so it cannot hold a bandwidth share")
	}
	// ipvlan children carry the parent's MAC: told apart by address.
	byAddress := (egress > 0 || ingress > 0) && p.keysByAddress(cfg)
	if byAddress {
		if err := checkAddressable(cfg); err != nil {
			return prepare.Prepared{}, err
		}
	}
	// The pools must take a share of this parent and VLAN: checked before
	// anything is made, so a refusal leaves nothing to undo.
	for _, name := range cfg.Pools {
		pool, ok := p.opts.Config.Pool(name)
		if !ok {
			return prepare.Prepared{}, fmt.Errorf("address pool %q is not in the node config", name)
		}
		if why := pool.Admits(dev.NIC.Name, cfg.VLAN); why != "" {
			return prepare.Prepared{}, errors.New(why)
		}
	}
	// Floors and ceilings, and the class's ethertypes, checked before
	// anything is made too.
	egressRates, ingressRates, err := ceilings(cfg, p.linkRate(dev, names.CapEgressBandwidth), p.linkRate(dev, names.CapIngressBandwidth), egress, ingress)
	if err != nil {
		return prepare.Prepared{}, err
	}
	ethertypes, err := cfg.EthertypeValues()
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("NetworkConfig %w", err)
	}
	if cfg.MacvlanMode == "bridge" && (egress > 0 || ingress > 0) {
		// Bridge mode hands frames between children of the parent
		// straight across, never through the parent's shaper (a 20M
		// share sent 700 Mbit/s to its neighbour on this machine).
		return prepare.Prepared{}, errors.New("macvlanMode bridge would let a bandwidth share bypass its limit towards other shares of the parent; use vepa (the default) or private")
	}
	lower := parent
	if cfg.VLAN != 0 {
		if lower, err = p.lockedVLAN(parent, cfg.VLAN); err != nil {
			return prepare.Prepared{}, err
		}
	}
	// The interface's name and MAC derive from the share's key. The hook
	// makes the interface, in the pod (checkChild).
	if err := p.checkChild(lower, cfg, u.Link, ShareMAC(key), mtu); err != nil {
		return prepare.Prepared{}, err
	}
	// The attach spec, first as the share's record on the node: a crash
	// from here on is undone from it and the allocation (it names the
	// parent, as the interface on the node did when prepare made one).
	// Written again, complete, below; neither write waits for the disk.
	specPath := p.specPath(u.Link)
	spec := p.ownerOf(a)
	spec.HostName, spec.Parent = u.Link, dev.NIC.Name
	spec.Kind, spec.Mode, spec.VLAN = hook.ChildKind(net1Mode(cfg)), net1Mode(cfg), cfg.VLAN
	mac := ShareMAC(key)
	spec.PodName, spec.MTU, spec.MAC = cmp.Or(cfg.InterfaceName, "net1"), mtu, mac.String()
	spec.GSOMaxSegs = gsoMaxSegs(egress, mtu)
	spec.AllowNetAdmin = cfg.AllowNetAdmin
	for _, r := range cfg.Routes {
		spec.Routes = append(spec.Routes, hook.Route(r))
	}
	// A prepare again (the kubelet's retry) finds the complete one, whose
	// pool addresses must stay until the pools read them.
	if _, err := os.Stat(specPath); errors.Is(err, os.ErrNotExist) {
		if err := hook.WriteAttachSpec(specPath, spec); err != nil {
			return prepare.Prepared{}, err
		}
	}
	crash.Point("nic-link-created")

	// Enforcement, under the parent's lock: egress classified on the
	// parent by the sending pod's namespace, else source MAC, and held
	// on the parent's egress shaper; ingress by destination MAC on the
	// parent's IFB; by address instead where the share is told apart by
	// address.
	if egress > 0 || ingress > 0 {
		links := [2]uint64{p.linkRate(dev, names.CapEgressBandwidth), p.linkRate(dev, names.CapIngressBandwidth)}
		if err := p.enforce(ctx, parent, key, egressRates, ingressRates, links, u); err != nil {
			return prepare.Prepared{}, err
		}
	}
	crash.Point("nic-shaped")

	// The attach spec, complete: what the hook does in the pod, and the
	// share's addresses, static ones as given and one from each pool.
	if p.opts.Shaper != nil && p.opts.PinDir != "" {
		// Every share of a shaped parent, limited or not: a share
		// without an egress class is then never charged to another.
		// Its frames are checked as SR-IOV's spoofchk would: the
		// share's MAC (unless the class allows changes), its VLAN only,
		// and its addresses where it has some.
		spec.PodShare = &hook.PodShareSpec{PinDir: p.opts.PinDir, ParentIndex: parent.Attrs().Index,
			VLAN: cfg.VLAN, AllowMACChange: cfg.AllowMACChange, AllowRouterAdvertisements: cfg.AllowRouterAdvertisements}
		spec.PodShare.CheckIPv4, spec.PodShare.CheckIPv6 = p.checkedFamilies(cfg)
		if u.EgressMinor != 0 {
			spec.PodShare.ClassID = uint32(netlink.MakeHandle(1, u.EgressMinor))
		}
		spec.PodShare.IngressAQM = u.IngressMinor != 0 && u.FlowClasses
		// The same checks on the pod's own interface, for every frame
		// it sends (bpf/podguard.go); the hook attaches it.
		guard := spec.PodShare.Checks()
		guard.Parent, guard.MAC = spec.PodShare.ParentIndex, mac.String()
		if err := p.opts.Shaper.PinPodGuard(u.Link, guard); err != nil {
			return prepare.Prepared{}, err
		}
		spec.PodShare.Guard, u.PodGuard = true, true
	}
	u.Addresses = append(u.Addresses, cfg.Addresses...)
	if len(cfg.Pools) > 0 {
		if err := p.allocateFromPools(ctx, cfg.Pools, a, spec, specPath, u); err != nil {
			return prepare.Prepared{}, err
		}
	} else {
		spec.Addresses = u.Addresses
		if err := hook.WriteAttachSpec(specPath, spec); err != nil {
			return prepare.Prepared{}, err
		}
	}
	spec.Addresses = u.Addresses
	if ps := spec.PodShare; ps != nil {
		if err := p.guardSources(parent, mac, u.Addresses, ps.Checks(), ethertypes); err != nil {
			return prepare.Prepared{}, err
		}
	}
	// Where the share is told apart by address (ipvlan), its classifier
	// entries are keyed on the addresses it now has.
	if byAddress {
		if err := p.keyByAddress(parent, ShareMAC(key), u); err != nil {
			return prepare.Prepared{}, err
		}
	}
	p.mu.Lock()
	p.labels[u.MAC] = labelsOf(a).withDropBase(*u)
	p.mu.Unlock()
	logger.V(2).Info("Prepared NIC share", "parent", dev.NIC.Name, "link", u.Link, "mac", u.MAC,
		"egressBitsPerSecond", egress, "ingressBitsPerSecond", ingress, "addresses", u.Addresses)
	raw, err := json.Marshal(u)
	if err != nil {
		return prepare.Prepared{}, err
	}
	// The MAC the pod's interface has: an ipvlan child carries its
	// parent's; the share's own MAC then only names its classifier
	// entries.
	podMAC := spec.MAC
	if spec.Kind == "ipvlan" {
		podMAC = lower.Attrs().HardwareAddr.String()
	}
	prefix := a.EnvPrefix()
	edits := cdispec.ContainerEdits{
		Env: []string{prefix + "PARENT=" + dev.NIC.Name, prefix + "INTERFACE=" + spec.PodName, prefix + "MTU=" + strconv.Itoa(mtu),
			prefix + "MAC=" + podMAC},
		Hooks: []*cdispec.Hook{{HookName: "createRuntime", Path: p.opts.HookPath,
			Args: append(append([]string(nil), p.hookArgs()...), "--spec", specPath), Timeout: ptr.To(hook.TimeoutSeconds)}},
	}
	if len(u.Addresses) > 0 {
		edits.Env = append(edits.Env, prefix+"ADDRESSES="+strings.Join(u.Addresses, ","))
	}
	return prepare.Prepared{Edits: edits, Undo: raw, Network: &resourceapi.NetworkDeviceData{
		InterfaceName: spec.PodName, IPs: u.Addresses, HardwareAddress: podMAC}}, nil
}

// checkedFamilies says in which families the share's frames are checked
// against its addresses: every family but one its class opens
// (openFamilies) and carve gives it no address of. A closed family the
// share has no address in is checked against none, which shuts it.
func (p *NICPreparer) checkedFamilies(cfg v1alpha1.NetworkConfig) (v4, v6 bool) {
	has4, has6 := p.addressFamilies(cfg)
	return has4 || !cfg.Opens(v1alpha1.FamilyIPv4), has6 || !cfg.Opens(v1alpha1.FamilyIPv6)
}

// addressFamilies says which families the share will have addresses of:
// its static addresses' and its pools'.
func (p *NICPreparer) addressFamilies(cfg v1alpha1.NetworkConfig) (v4, v6 bool) {
	note := func(a netip.Addr) {
		v4 = v4 || a.Unmap().Is4()
		v6 = v6 || (a.Is6() && !a.Is4In6())
	}
	for _, s := range cfg.Addresses {
		if a, err := addressOf(s); err == nil {
			note(a)
		}
	}
	for _, name := range cfg.Pools {
		if pool, ok := p.opts.Config.Pool(name); ok {
			if pfx, err := netip.ParsePrefix(pool.CIDR); err == nil {
				note(pfx.Addr())
			}
		}
	}
	return v4, v6
}

// guardSources records what the share's pod may send: its addresses, the
// ethertypes its class lists besides IP and ARP, and the parent's MAC as
// the node's own (never learned for a pod; the MAC an ipvlan child's
// frames carry). The entries go with the share's pod
// entries at unprepare (bpf.Shaper.DeletePodShares). The share's egress
// entry gets guard, the checks the hook gives its pod's entry, for frames
// the pod sends with no socket of its own (the kernel's ARP replies,
// forwarded frames); it goes with the share's egress entry.
func (p *NICPreparer) guardSources(parent netlink.Link, mac net.HardwareAddr, addresses []string, guard bpf.PodShare, ethertypes []uint16) error {
	if err := p.opts.Shaper.GuardShare(mac, guard); err != nil {
		return err
	}
	if err := p.opts.Shaper.AllowEthertypes(parent.Attrs().Index, mac, ethertypes); err != nil {
		return fmt.Errorf("the share's ethertypes on %s: %w", parent.Attrs().Name, err)
	}
	if hw := parent.Attrs().HardwareAddr; len(hw) == 6 {
		if err := p.opts.Shaper.SetLocalMAC(parent.Attrs().Index, hw); err != nil {
			return fmt.Errorf("record the MAC of parent %s: %w", parent.Attrs().Name, err)
		}
	}
	for _, s := range addresses {
		addr, err := addressOf(s)
		if err != nil {
			return err
		}
		if err := p.opts.Shaper.AllowAddr(parent.Attrs().Index, guard.VLAN, addr, mac); err != nil {
			return fmt.Errorf("address %s of the share on %s: %w", s, parent.Attrs().Name, err)
		}
	}
	return nil
}

// enforce holds the share to its egress and ingress rates (bits/s; 0 for
// none), recording in u what it made: its classes under the parent's lock
// (shapeClass), then their queues and classifier entries outside it
// (shapeQueues).
func (p *NICPreparer) enforce(ctx context.Context, parent netlink.Link, key string, egress, ingress classRates, links [2]uint64, u *undoRecord) (err error) {
	defer func() {
		if err != nil {
			// The next prepare looks at the parent's HTB and IFB
			// again, whatever happened to them.
			p.setUp.forgetDevice(parent.Attrs().Index)
			p.setUp.forgetCompanion(companionIFB, parent.Attrs().Index)
		}
	}()
	classes, err := p.shapeClasses(ctx, parent, key, egress, ingress, links, u)
	if err != nil {
		return err
	}
	mac := ShareMAC(key)
	for _, sc := range classes {
		flows, err := p.shapeQueues(sc, key, mac)
		u.FlowClasses = u.FlowClasses || flows
		if err != nil {
			return fmt.Errorf("%s: %w", sc.dir, err)
		}
	}
	return nil
}

// shapeClasses makes the share's egress and ingress classes under the
// parent's lock, recording each in u as soon as it exists, and sets the
// rates of the borrowing shares on each device again with the new floor
// among them (excess.go), before the share has a frame.
func (p *NICPreparer) shapeClasses(ctx context.Context, parent netlink.Link, key string, egress, ingress classRates, links [2]uint64, u *undoRecord) ([]shapedClass, error) {
	unlock, err := p.lockParent(parent)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var classes []shapedClass
	if egress.floor > 0 {
		if egress.borrows() {
			u.EgressCeiling = egress.ceil
		}
		sc, err := p.shapeClass(parent, key, egress, links[0], bpf.Egress)
		u.EgressMinor, u.EgressDropBase = sc.pick.minor, sc.pick.drops
		if err != nil {
			return nil, fmt.Errorf("egress: %w", err)
		}
		classes = append(classes, sc)
	}
	if ingress.floor > 0 {
		if ingress.borrows() {
			u.IngressCeiling = ingress.ceil
		}
		ifb, err := p.ensureIngressIFB(parent, links[1])
		if err != nil {
			return nil, fmt.Errorf("ingress: %w", err)
		}
		sc, err := p.shapeClass(ifb, key, ingress, links[1], bpf.Ingress)
		u.IngressMinor, u.IngressDropBase = sc.pick.minor, sc.pick.drops
		if err != nil {
			return nil, fmt.Errorf("ingress: %w", err)
		}
		classes = append(classes, sc)
	}
	for _, sc := range classes {
		if err := p.assureExcess(ctx, sc.classDev.Attrs().Index); err != nil {
			return classes, fmt.Errorf("%s: %w", sc.dir, err)
		}
	}
	return classes, nil
}

// lockedVLAN is ensureVLAN under the parent's lock: the VLAN interface is
// shared by the parent's shares on that VLAN.
func (p *NICPreparer) lockedVLAN(parent netlink.Link, id int) (netlink.Link, error) {
	unlock, err := p.lockParent(parent)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return p.ensureVLAN(parent, id)
}

// bandwidth is the share's consumed capacity in bits/s (0: none).
func bandwidth(a prepare.Allocation, name resourceapi.QualifiedName) uint64 {
	q, ok := a.Consumed[name]
	if !ok || q.Sign() <= 0 {
		return 0
	}
	return uint64(q.Value())
}

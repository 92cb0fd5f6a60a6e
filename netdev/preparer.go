// Package netdev prepares network claims: a share of a parent NIC given to a
// pod as its own macvlan or ipvlan interface, with its bandwidth held to the
// allocation in both directions. It is, with bpf, the only package that
// calls netlink; the node's network namespace is passed in explicitly.
package netdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// Options configure a Preparer.
type Options struct {
	// HostNS is the node's network namespace, where parent NICs live.
	HostNS netns.NsHandle
	// StateDir holds the per-share attach specs the hook reads; the same
	// path on the host and in the agent's container.
	StateDir string
	// HookPath is the carve binary as the container runtime on the host
	// sees it; CDI runs it as a createRuntime hook.
	HookPath string
	Config   *nodeconfig.NodeConfig
	// Shaper is the BPF classifier; nil turns bandwidth enforcement off
	// (and then bandwidth shares are refused).
	Shaper *bpf.Shaper
	// PinDir is where Shaper is pinned; unprepare removes links there
	// whose namespace is gone.
	PinDir string
}

// Preparer prepares NIC allocations.
type Preparer struct {
	opts Options
	h    *netlink.Handle
	ipam *ipam
	// mu guards the HTB minors in use, by parent device, and the labels
	// of each share's MAC for the metrics.
	mu     sync.Mutex
	minors map[string]map[uint16]string
	labels map[string]shareLabels
	// noFQ is set once adding fq failed: the kernel has no sch_fq.
	noFQ bool
	// tcMu orders the changes of parents' qdiscs: two shares of one
	// parent unprepared at once would each see the other's class and
	// both leave the parent's HTB and IFB behind, and a prepare could
	// add a class to a qdisc an unprepare is removing.
	tcMu sync.Mutex
}

// shareLabels name a share in metrics.
type shareLabels struct {
	claim, shareID string
}

// NewPreparer opens a netlink handle in the node's namespace.
func NewPreparer(opts Options) (*Preparer, error) {
	h, err := netlink.NewHandleAt(opts.HostNS)
	if err != nil {
		return nil, fmt.Errorf("netlink in the node's namespace: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "netdev"), 0o755); err != nil {
		return nil, err
	}
	return &Preparer{opts: opts, h: h, ipam: newIPAM(), minors: map[string]map[uint16]string{}, labels: map[string]shareLabels{}}, nil
}

// undoRecord is what Unprepare needs; it is kept in the checkpoint.
type undoRecord struct {
	Parent      string `json:"parent"`
	Link        string `json:"link"`
	MAC         string `json:"mac"`
	EgressMinor uint16 `json:"egressMinor,omitempty"`
	// EgressEDT is set where egress is paced by EDT with fq instead.
	EgressEDT    bool     `json:"egressEDT,omitempty"`
	IngressMinor uint16   `json:"ingressMinor,omitempty"`
	Addresses    []string `json:"addresses,omitempty"`
	PoolAddrs    []string `json:"poolAddresses,omitempty"`
}

// Restore takes back, at the agent's start, the addresses and classes of
// shares prepared before, and removes classifier entries that belong to no
// share in the checkpoint (left by a crash), so that the pins agree with it.
func (p *Preparer) Restore(allocs []prepare.Allocation, undos []json.RawMessage) {
	keep := map[string]bool{}
	for i, a := range allocs {
		key := a.ShareKey()
		keep[ShareMAC(key).String()] = true
		var u undoRecord
		if len(undos[i]) == 0 || json.Unmarshal(undos[i], &u) != nil {
			continue
		}
		var addrs []netip.Prefix
		for _, s := range u.PoolAddrs {
			if pfx, err := netip.ParsePrefix(s); err == nil {
				addrs = append(addrs, pfx)
			}
		}
		p.ipam.reserve(key, addrs)
		p.mu.Lock()
		p.labels[u.MAC] = labelsOf(a)
		for _, m := range []uint16{u.EgressMinor, u.IngressMinor} {
			if m != 0 {
				p.minorSet(u.Parent)[m] = key
			}
		}
		p.mu.Unlock()
	}
	if p.opts.Shaper == nil {
		return
	}
	shares, err := p.opts.Shaper.Shares()
	if err != nil {
		return
	}
	for k := range shares {
		if !keep[k.MAC] {
			if mac, err := net.ParseMAC(k.MAC); err == nil {
				_ = p.opts.Shaper.DeleteShare(k.Dir, mac)
			}
		}
	}
}

func (p *Preparer) minorSet(parent string) map[uint16]string {
	s, ok := p.minors[parent]
	if !ok {
		s = map[uint16]string{}
		p.minors[parent] = s
	}
	return s
}

// pickMinor returns key's class minor on a device: its own if it has one,
// else its preferred one or the next free.
func (p *Preparer) pickMinor(device, key string, taken map[uint16]uint64) (uint16, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(device)
	for m, k := range set {
		if k == key {
			return m, nil
		}
	}
	start := preferredMinor(key)
	for i := 0; i < int(maxMinor-minMinor); i++ {
		m := minMinor + uint16((int(start-minMinor)+i)%int(maxMinor-minMinor))
		if _, used := set[m]; used {
			continue
		}
		if _, exists := taken[m]; exists {
			continue
		}
		set[m] = key
		return m, nil
	}
	return 0, fmt.Errorf("no free HTB class on %s", device)
}

func (p *Preparer) freeMinors(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, set := range p.minors {
		for m, k := range set {
			if k == key {
				delete(set, m)
			}
		}
	}
}

// Prepare creates the share's interface on the parent (left down, in the
// node's namespace: the pod's does not exist yet), gives it its addresses,
// holds its bandwidth with HTB classes chosen by the BPF classifier, and
// returns the CDI hook that moves it into the pod.
func (p *Preparer) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.NIC == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not a NIC", a.Device)
	}
	cfg, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("config: %w", err)
	}
	net1 := prepare.NetworkConfig{}
	if cfg.Network != nil {
		net1 = *cfg.Network
	}
	key := a.ShareKey()
	u := undoRecord{Parent: dev.NIC.Name, Link: LinkName(key), MAC: ShareMAC(key).String()}
	p.tcMu.Lock()
	defer p.tcMu.Unlock()
	prepared, err := p.prepare(ctx, a, dev, net1, key, &u)
	if err != nil {
		raw, _ := json.Marshal(u)
		if uerr := p.unprepare(ctx, a, raw); uerr != nil {
			err = fmt.Errorf("%w (and undoing: %v)", err, uerr)
		}
		return prepare.Prepared{}, err
	}
	return prepared, nil
}

func (p *Preparer) prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry, cfg prepare.NetworkConfig, key string, u *undoRecord) (prepare.Prepared, error) {
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
	egress, ingress := bandwidth(a, resourceapiEgress), bandwidth(a, resourceapiIngress)
	if (egress > 0 || ingress > 0) && p.opts.Shaper == nil {
		return prepare.Prepared{}, errors.New("this agent has no BPF classifier, so it cannot hold a bandwidth share")
	}
	if cfg.Mode == "ipvlan" && (egress > 0 || ingress > 0) {
		// ipvlan children share the parent's MAC; the classifier keys
		// on MACs. Refused rather than left unenforced.
		return prepare.Prepared{}, errors.New("bandwidth shares of ipvlan interfaces are not enforced yet; use mode macvlan")
	}
	// Recorded first: with it, Unprepare finds the parent of a share
	// whose preparation was cut short and whose interface has moved.
	specPath := p.specPath(u.Link)
	if err := writeAttachSpec(specPath, AttachSpec{HostName: u.Link, Parent: dev.NIC.Name}); err != nil {
		return prepare.Prepared{}, err
	}
	lower := parent
	if cfg.VLAN != 0 {
		if lower, err = p.ensureVLAN(parent, cfg.VLAN); err != nil {
			return prepare.Prepared{}, err
		}
	}
	if err := p.ensureChild(lower, cfg, u.Link, ShareMAC(key), mtu); err != nil {
		return prepare.Prepared{}, err
	}
	prepare.CrashPoint("nic-link-created")

	// Addresses: static ones as given, and one from each pool.
	u.Addresses = append(u.Addresses, cfg.Addresses...)
	for _, name := range cfg.Pools {
		pool, ok := p.opts.Config.Pool(name)
		if !ok {
			return prepare.Prepared{}, fmt.Errorf("address pool %q is not in the node config", name)
		}
		addr, err := p.ipam.allocate(pool, key)
		if err != nil {
			return prepare.Prepared{}, err
		}
		u.PoolAddrs = append(u.PoolAddrs, addr.String())
		u.Addresses = append(u.Addresses, addr.String())
	}

	// Enforcement: egress by source MAC on the parent, ingress by
	// destination MAC on the parent's IFB.
	mac := ShareMAC(key)
	if egress > 0 {
		if p.edtOn(parent) {
			u.EgressEDT = true
			if err := p.pace(parent, mac, egress); err != nil {
				return prepare.Prepared{}, fmt.Errorf("egress: %w", err)
			}
		} else if u.EgressMinor, err = p.shape(parent, key, egress, bpf.Egress, mac); err != nil {
			return prepare.Prepared{}, fmt.Errorf("egress: %w", err)
		}
	}
	if ingress > 0 {
		ifb, err := ensureIngressIFB(p.h, parent)
		if err != nil {
			return prepare.Prepared{}, fmt.Errorf("ingress: %w", err)
		}
		if u.IngressMinor, err = p.shape(ifb, key, ingress, bpf.Ingress, mac); err != nil {
			return prepare.Prepared{}, fmt.Errorf("ingress: %w", err)
		}
	}

	prepare.CrashPoint("nic-shaped")
	spec := AttachSpec{HostName: u.Link, Parent: dev.NIC.Name, PodName: orDefault(cfg.InterfaceName, "net1"), MTU: mtu, MAC: mac.String(),
		Addresses: u.Addresses, Routes: cfg.Routes}
	if err := writeAttachSpec(specPath, spec); err != nil {
		return prepare.Prepared{}, err
	}
	p.mu.Lock()
	p.labels[u.MAC] = labelsOf(a)
	p.mu.Unlock()
	logger.V(2).Info("Prepared NIC share", "parent", dev.NIC.Name, "link", u.Link, "mac", u.MAC,
		"egressBitsPerSecond", egress, "ingressBitsPerSecond", ingress, "addresses", u.Addresses)
	raw, err := json.Marshal(u)
	if err != nil {
		return prepare.Prepared{}, err
	}
	prefix := a.EnvPrefix()
	edits := cdispec.ContainerEdits{
		Env: []string{prefix + "PARENT=" + dev.NIC.Name, prefix + "INTERFACE=" + spec.PodName, prefix + "MTU=" + strconv.Itoa(mtu),
			prefix + "MAC=" + spec.MAC},
		Hooks: []*cdispec.Hook{{HookName: "createRuntime", Path: p.opts.HookPath,
			Args: []string{"carve", "hook", "netns-attach", "--spec", specPath}}},
	}
	if len(u.Addresses) > 0 {
		edits.Env = append(edits.Env, prefix+"ADDRESSES="+joinComma(u.Addresses))
	}
	return prepare.Prepared{Edits: edits, Undo: raw, Network: &resourceapi.NetworkDeviceData{
		InterfaceName: spec.PodName, IPs: u.Addresses, HardwareAddress: spec.MAC}}, nil
}

// shape gives the share a class of rate bits/s on dev and points the
// classifier at it.
func (p *Preparer) shape(dev netlink.Link, key string, rate uint64, dir bpf.Direction, mac net.HardwareAddr) (uint16, error) {
	if err := ensureHTB(p.h, dev); err != nil {
		return 0, err
	}
	taken, err := shareClasses(p.h, dev)
	if err != nil {
		return 0, err
	}
	minor, err := p.pickMinor(dev.Attrs().Name, key, taken)
	if err != nil {
		return 0, err
	}
	if err := setClass(p.h, dev, minor, rate); err != nil {
		return 0, err
	}
	if err := inNetns(p.opts.HostNS, func() error { return p.opts.Shaper.Attach(dev.Attrs().Index, dir) }); err != nil {
		return 0, fmt.Errorf("attach the classifier to %s: %w", dev.Attrs().Name, err)
	}
	if err := p.opts.Shaper.SetShare(dir, mac, uint32(netlink.MakeHandle(1, minor))); err != nil {
		return 0, fmt.Errorf("classifier entry: %w", err)
	}
	return minor, nil
}

// edtOn reports whether the parent's egress is paced with EDT: where the
// kernel has sch_fq, carve puts fq at the parent's root (unless carve's HTB
// already holds it) and stamps each share's frames with their earliest
// departure time, which costs less than HTB's class tree.
func (p *Preparer) edtOn(parent netlink.Link) bool {
	qdiscs, err := p.h.QdiscList(parent)
	if err != nil {
		return false
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		switch {
		case q.Type() == "fq":
			return true
		case q.Type() == "htb" && q.Attrs().Handle == rootHandle:
			return false
		}
	}
	p.mu.Lock()
	noFQ := p.noFQ
	p.mu.Unlock()
	if noFQ {
		return false
	}
	fq := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0x8000, 0)}}
	if err := p.h.QdiscReplace(fq); err != nil {
		// No sch_fq in this kernel: HTB it is, from now on.
		p.mu.Lock()
		p.noFQ = true
		p.mu.Unlock()
		return false
	}
	return true
}

// pace holds mac's frames to rate bits/s by EDT on the parent's fq.
func (p *Preparer) pace(parent netlink.Link, mac net.HardwareAddr, rate uint64) error {
	if err := inNetns(p.opts.HostNS, func() error { return p.opts.Shaper.AttachEDT(parent.Attrs().Index) }); err != nil {
		return fmt.Errorf("attach the EDT program to %s: %w", parent.Attrs().Name, err)
	}
	if err := p.opts.Shaper.SetRate(mac, rate); err != nil {
		return fmt.Errorf("EDT rate entry: %w", err)
	}
	return nil
}

// Unprepare removes the share's classifier entries, classes, interface,
// addresses and attach spec. With no undo record (a crash came before
// Prepare returned) it finds them from the allocation: the names and the
// MAC derive from the share's key, and the classifier maps the MAC to its
// classes.
func (p *Preparer) Unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	p.tcMu.Lock()
	defer p.tcMu.Unlock()
	return p.unprepare(ctx, a, raw)
}

func (p *Preparer) unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	key := a.ShareKey()
	u := undoRecord{Link: LinkName(key), MAC: ShareMAC(key).String()}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &u); err != nil {
			return fmt.Errorf("undo record: %w", err)
		}
	}
	mac, _ := net.ParseMAC(u.MAC)
	var errs []error
	if p.opts.Shaper != nil {
		shares, err := p.opts.Shaper.Shares()
		if err != nil {
			errs = append(errs, err)
		}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			classid, ok := shares[bpf.Key{MAC: mac.String(), Dir: dir}]
			if !ok {
				continue
			}
			if err := p.opts.Shaper.DeleteShare(dir, mac); err != nil {
				errs = append(errs, err)
			}
			_, minor := netlink.MajorMinor(classid)
			if dir == bpf.Egress && u.EgressMinor == 0 {
				u.EgressMinor = minor
			}
			if dir == bpf.Ingress && u.IngressMinor == 0 {
				u.IngressMinor = minor
			}
		}
	}
	if p.opts.Shaper != nil {
		// Idempotent, and harmless where the share was never paced.
		if err := p.opts.Shaper.SetRate(mac, 0); err != nil {
			errs = append(errs, err)
		}
	}
	if u.Parent == "" {
		// Without a record: the attach spec names the parent, else the
		// link (if still on the node) does.
		if spec, err := ReadAttachSpec(p.specPath(u.Link)); err == nil {
			u.Parent = spec.Parent
		} else {
			u.Parent = p.parentOf(u.Link)
		}
	}
	if parent, err := p.h.LinkByName(u.Parent); err == nil {
		if u.EgressMinor != 0 {
			errs = append(errs, deleteClass(p.h, parent, u.EgressMinor), removeHTBIfIdle(p.h, parent))
		}
		if ifb, err := p.h.LinkByName(ifbName(parent)); err == nil && u.IngressMinor != 0 {
			errs = append(errs, deleteClass(p.h, ifb, u.IngressMinor), removeIngressIFBIfIdle(p.h, parent))
		}
	}
	if link, err := p.h.LinkByName(u.Link); err == nil {
		if err := p.h.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", u.Link, err))
		}
	}
	// A link already moved into the pod goes with the pod's namespace;
	// a classifier link pinned for a device whose namespace is gone is
	// dead weight.
	if p.opts.PinDir != "" {
		if _, err := bpf.CleanupDefunct(p.opts.PinDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(p.specPath(u.Link)); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	p.ipam.release(key)
	p.freeMinors(key)
	p.mu.Lock()
	delete(p.labels, u.MAC)
	p.mu.Unlock()
	err := errors.Join(errs...)
	klog.FromContext(ctx).V(2).Info("Unprepared NIC share", "parent", u.Parent, "link", u.Link, "mac", u.MAC,
		"egressClass", u.EgressMinor, "ingressClass", u.IngressMinor, "err", err)
	return err
}

// parentOf finds the parent of a share's link still on the node; "" when
// the link is gone.
func (p *Preparer) parentOf(linkName string) string {
	link, err := p.h.LinkByName(linkName)
	if err != nil || link.Attrs().ParentIndex == 0 {
		return ""
	}
	parent, err := p.h.LinkByIndex(link.Attrs().ParentIndex)
	if err != nil {
		return ""
	}
	return parent.Attrs().Name
}

func (p *Preparer) specPath(link string) string {
	return filepath.Join(p.opts.StateDir, "netdev", link+".json")
}

// ensureChild creates the share's macvlan or ipvlan interface on lower,
// down, unless it is there already.
func (p *Preparer) ensureChild(lower netlink.Link, cfg prepare.NetworkConfig, name string, mac net.HardwareAddr, mtu int) error {
	if existing, err := p.h.LinkByName(name); err == nil {
		if existing.Attrs().ParentIndex != lower.Attrs().Index {
			return fmt.Errorf("interface %s exists on another parent", name)
		}
		return nil
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex, la.MTU = name, lower.Attrs().Index, mtu
	var link netlink.Link
	switch cfg.Mode {
	case "ipvlan":
		mode := map[string]netlink.IPVlanMode{"": netlink.IPVLAN_MODE_L2, "l2": netlink.IPVLAN_MODE_L2, "l3": netlink.IPVLAN_MODE_L3, "l3s": netlink.IPVLAN_MODE_L3S}[cfg.IPVlanMode]
		link = &netlink.IPVlan{LinkAttrs: la, Mode: mode}
	default:
		la.HardwareAddr = mac
		mode := map[string]netlink.MacvlanMode{"": netlink.MACVLAN_MODE_BRIDGE, "bridge": netlink.MACVLAN_MODE_BRIDGE,
			"private": netlink.MACVLAN_MODE_PRIVATE, "vepa": netlink.MACVLAN_MODE_VEPA, "passthru": netlink.MACVLAN_MODE_PASSTHRU}[cfg.MacvlanMode]
		link = &netlink.Macvlan{LinkAttrs: la, Mode: mode}
	}
	if err := p.h.LinkAdd(link); err != nil {
		return fmt.Errorf("create %s %s on %s: %w", orDefault(cfg.Mode, "macvlan"), name, lower.Attrs().Name, err)
	}
	return nil
}

// ensureVLAN returns the parent's VLAN interface, creating it if needed.
func (p *Preparer) ensureVLAN(parent netlink.Link, id int) (netlink.Link, error) {
	name := fmt.Sprintf("cv%d.%d", parent.Attrs().Index, id)
	if l, err := p.h.LinkByName(name); err == nil {
		return l, nil
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = name, parent.Attrs().Index
	if err := p.h.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: id}); err != nil {
		return nil, fmt.Errorf("create VLAN %d on %s: %w", id, parent.Attrs().Name, err)
	}
	l, err := p.h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	return l, p.h.LinkSetUp(l)
}

const (
	resourceapiEgress  resourceapi.QualifiedName = "egressBandwidth"
	resourceapiIngress resourceapi.QualifiedName = "ingressBandwidth"
)

// bandwidth is the share's consumed capacity in bits/s (0: none).
func bandwidth(a prepare.Allocation, name resourceapi.QualifiedName) uint64 {
	q, ok := a.Consumed[name]
	if !ok || q.Sign() <= 0 {
		return 0
	}
	return uint64(q.Value())
}

func labelsOf(a prepare.Allocation) shareLabels {
	l := shareLabels{claim: a.ClaimNamespace + "/" + a.ClaimName}
	if a.ShareID != nil {
		l.shareID = string(*a.ShareID)
	}
	return l
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func joinComma(list []string) string {
	out := ""
	for i, s := range list {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

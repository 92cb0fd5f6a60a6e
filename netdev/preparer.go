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
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev/addrbook"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// Options configure a NICPreparer.
type Options struct {
	// HostNS is the node's network namespace, where parent NICs live.
	HostNS netns.NsHandle
	// StateDir holds the per-share attach specs the hook reads; the same
	// path on the host and in the agent's container.
	StateDir string
	// HookPath is the hook binary as the container runtime on the host
	// sees it; CDI runs it as a createRuntime hook. HookArgs is its argv up
	// to the flags: ["carve-hook", "netns-attach"] for the small static
	// hook, ["carve", "hook", "netns-attach"] (the default) for the agent's
	// own binary.
	HookPath string
	HookArgs []string
	Config   *nodeconfig.NodeConfig
	// Shaper is the BPF classifier; nil turns bandwidth enforcement off
	// (and then bandwidth shares are refused).
	Shaper *bpf.Shaper
	// PinDir is where Shaper is pinned; unprepare removes links there
	// whose namespace is gone.
	PinDir string
	// BootID is the running kernel's boot id, recorded in each share's
	// attach spec; specs of another boot are removed at start.
	BootID string
	// Addresses records the addresses of cluster-wide pools in the API
	// server; nil where the agent has none, and such pools refuse shares.
	Addresses *addrbook.Book
}

// NICPreparer prepares NIC allocations.
type NICPreparer struct {
	opts Options
	h    *netlink.Handle
	// route is a netlink socket of the node's namespace for the requests
	// the netlink package cannot make (a bfifo's limit): one socket for
	// all of them, where each opened its own and entered the namespace
	// to do it, twenty times a share.
	route *nl.SocketHandle
	ipam  *ipam
	// mu guards the HTB minors in use, by parent device, the labels of
	// each share's MAC for the metrics, and the shares each parent holds
	// (held.go).
	mu     sync.Mutex
	minors map[string]map[uint16]string
	// blocks indexes minors by device and share (minors.go).
	blocks map[string]map[string][]uint16
	// parked holds the blocks of classes waiting for a share, by device,
	// and scanned the devices whose blocks parked before this agent
	// started are known (park.go).
	parked  map[string][]parkedBlock
	scanned map[string]bool
	// plainRoot holds the parents (by ifindex) whose root qdisc was
	// found not to be an older carve's HTB (parentRootIsHTB).
	plainRoot map[int]bool
	labels    map[string]shareLabels
	held      map[string]map[string]bool
	// nestedRemoved counts the links each share's pod nested on its
	// parent that WatchNestedLinks removed, by the share's MAC.
	nestedRemoved map[string]uint64
	// excess holds each device's share classes, by ifindex, whose
	// borrowers are assured their parts of the excess (excess.go).
	excess map[int]*excessDevice
	// borrowed follows borrowing shares' counters between scrapes
	// (borrowmetrics.go).
	borrowed map[bpf.Key]*borrowedCounter
	// addressKeys tells every bandwidth share apart by address, not only
	// ipvlan's (tests, see KeyByAddress in export_test.go).
	addressKeys bool
	// noFQCodel is set once adding fq_codel failed: leaves are bfifos.
	noFQCodel bool
	// childKinds holds, by link kind (macvlan, ipvlan), what this
	// kernel answered when asked to make one (checkChild): nil, or why
	// it cannot; under childProbe.
	childKinds map[string]error
	childProbe sync.Mutex
	// plainQueues gives each share's class one bounded FIFO and no flow
	// children: the design before flow isolation, for tests that measure
	// against it (PlainQueues in export_test.go).
	plainQueues bool
	// queuesSet holds, by block, the rates its flow children and their
	// leaves were last set for by this agent (setQueues): a parked
	// block taken for a share of the same rates keeps them as they are.
	queuesSet map[blockKey]queuesOf
	// parkMark is what this agent writes into the rate of the classes
	// it parks (parkedRate), drawn at start: a block parked by another
	// agent (a rolling update's) or an earlier one has another, and its
	// children are set again when taken.
	parkMark uint32
	// parentLocks and poolMu are the in-process halves of the parents'
	// and the pools' locks (see locks.go).
	parentLocks parentLocks
	poolMu      sync.Mutex
	// reaper removes unprepared shares' kernel objects off the
	// kubelet's path.
	reaper *reaper
	// setUp is what carve set up on each device, known without a dump.
	setUp setUpCache
	// preparing counts prepares in flight; the reaper yields to them.
	preparing atomic.Int32
	// gate admits prepares a few at a time, in order (admit.go).
	gate prepareGate
}

var (
	_ prepare.Preparer = (*NICPreparer)(nil)
	_ prepare.Restorer = (*NICPreparer)(nil)
)

// NewNICPreparer opens a netlink handle in the node's namespace.
func NewNICPreparer(opts Options) (*NICPreparer, error) {
	h, err := netlink.NewHandleAt(opts.HostNS)
	if err != nil {
		return nil, fmt.Errorf("netlink in the node's namespace: %w", err)
	}
	// The agent's own: the state directory above lets others pass
	// through (a claim's MPS server reaches its pipe directory), and the
	// records, locks and reaper queue here are no one else's.
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "netdev"), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(opts.StateDir, "netdev"), 0o700); err != nil { //nolint:gosec // G302 wants 0600 of files; a directory needs x to be entered
		return nil, err
	}
	sock, err := nl.GetNetlinkSocketAt(opts.HostNS, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink in the node's namespace: %w", err)
	}
	timeout := unix.NsecToTimeval(routeTimeout.Nanoseconds())
	if err := errors.Join(sock.SetReceiveTimeout(&timeout), sock.SetSendTimeout(&timeout)); err != nil {
		sock.Close()
		h.Close()
		return nil, fmt.Errorf("netlink in the node's namespace: %w", err)
	}
	p := &NICPreparer{opts: opts, h: h, route: &nl.SocketHandle{Socket: sock}, ipam: newIPAM(), minors: map[string]map[uint16]string{},
		blocks: map[string]map[string][]uint16{}, plainRoot: map[int]bool{}, labels: map[string]shareLabels{},
		held: map[string]map[string]bool{}, queuesSet: map[blockKey]queuesOf{}, parkMark: newParkMark(), parked: map[string][]parkedBlock{}, scanned: map[string]bool{}, gate: newPrepareGate()}
	if p.reaper, err = newReaper(p); err != nil {
		h.Close()
		return nil, err
	}
	return p, nil
}

// WaitReaped blocks until every unprepared share's kernel objects are
// removed (or waiting for a retry after a failure).
func (p *NICPreparer) WaitReaped() { p.reaper.wait() }

// undoRecord is what Unprepare needs; it is kept in the checkpoint.
type undoRecord struct {
	Parent      string `json:"parent"`
	Link        string `json:"link"`
	MAC         string `json:"mac"`
	EgressMinor uint16 `json:"egressMinor,omitempty"`
	// EgressEDT is set where an older carve paced egress by EDT, with fq
	// at the parent's root; unprepare removes such a share's rate.
	EgressEDT    bool   `json:"egressEDT,omitempty"`
	IngressMinor uint16 `json:"ingressMinor,omitempty"`
	// FlowClasses is set where the share's classes have children for its
	// flows (flows.go): they go before their parent.
	FlowClasses bool `json:"flowClasses,omitempty"`
	// EgressDropBase and IngressDropBase are the drops HTB had counted on
	// the share's classes before it took them over (a parked block,
	// park.go): its own drops are what is counted past them.
	EgressDropBase  uint64   `json:"egressDropBase,omitempty"`
	IngressDropBase uint64   `json:"ingressDropBase,omitempty"`
	Addresses       []string `json:"addresses,omitempty"`
	PoolAddrs       []string `json:"poolAddresses,omitempty"`
	// EgressCeiling and IngressCeiling are what a share that borrows
	// (ceiling.go) may reach, bits/s; 0 for a hard cap at its floor.
	EgressCeiling  uint64 `json:"egressCeiling,omitempty"`
	IngressCeiling uint64 `json:"ingressCeiling,omitempty"`
	// VLAN is the share's VLAN on its parent, in which its addresses are
	// recorded in the classifier (0 for none, and in records of carves
	// before addresses were kept by VLAN: see migrateVLANAddrs).
	VLAN int `json:"vlan,omitempty"`
	// AddressKeyed is set where the classifier tells the share apart by
	// its addresses (ipvlan), not by its MAC.
	AddressKeyed bool `json:"addressKeyed,omitempty"`
	// PodGuard is set where the agent pinned a pod guard for the share
	// (bpf/podguard.go), which `carve shares` then expects.
	PodGuard bool `json:"podGuard,omitempty"`
}

// Restore takes back, at the agent's start, the addresses and classes of
// shares prepared before, and removes the attach specs of an earlier boot.
// It never removes a classifier entry: one that no record and no attach spec
// explains means the state directory was lost, and deleting it would
// unshape a running pod. Such entries are logged; their claims' unprepare
// still finds them by their derived names.
func (p *NICPreparer) Restore(allocs []prepare.Allocation, undos []json.RawMessage) {
	ctx := context.Background()
	keep := macsOf(p.removeSpecsOfOtherBoots(ctx))
	p.removeOrphanShapers(ctx)
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
		p.recordRestored(ctx, a, addrs)
		p.migrateVLANAddrs(ctx, a, u)
		p.reserveMinors(key, u.Parent, u.EgressMinor, u.IngressMinor, u.FlowClasses)
		p.restoreExcess(key, a, u)
		p.mu.Lock()
		p.labels[u.MAC] = labelsOf(a).withDropBase(u)
		if p.held[u.Parent] == nil {
			p.held[u.Parent] = map[string]bool{}
		}
		p.held[u.Parent][key] = true
		p.mu.Unlock()
	}
	p.resumeReaper(ctx)
	if p.opts.PinDir != "" {
		if err := p.removeStaleFilterGuards(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Removing the pod guards of unprepared shares")
		}
	}
	if p.opts.Shaper == nil {
		return
	}
	shares, err := p.opts.Shaper.Shares()
	if err != nil {
		return
	}
	var unexplained []string
	for k := range shares {
		if !keep[k.MAC] {
			unexplained = append(unexplained, k.MAC+"/"+k.Dir.String())
		}
	}
	if len(unexplained) > 0 {
		klog.FromContext(ctx).Info("Classifier entries that no record or attach spec explains are kept; was the state directory lost?", "entries", unexplained)
	}
}

// migrateVLANAddrs copies the classifier's address entries of a VLAN share
// that an agent before addresses were kept by VLAN prepared (its record
// names no VLAN; its allocation's config does) into its VLAN, where the
// classifier now looks them up; the untagged ones stay for the programs an
// older agent loaded (bpf.Shaper.CopyAddrsToVLAN). Idempotent: a copied
// share has nothing left to copy.
func (p *NICPreparer) migrateVLANAddrs(ctx context.Context, a prepare.Allocation, u undoRecord) {
	if p.opts.Shaper == nil || u.VLAN != 0 || len(u.Addresses) == 0 {
		return
	}
	eff, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil || eff.Network == nil || eff.Network.VLAN == 0 {
		return
	}
	mac, err := net.ParseMAC(u.MAC)
	if err != nil {
		return
	}
	copied, err := p.opts.Shaper.CopyAddrsToVLAN(mac, eff.Network.VLAN)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Copying a VLAN share's addresses into its VLAN; its pod's frames from them may be dropped", "share", u.Link, "vlan", eff.Network.VLAN)
	}
	if copied > 0 {
		klog.FromContext(ctx).Info("Copied a VLAN share's addresses into its VLAN (recorded by an older agent)", "share", u.Link, "vlan", eff.Network.VLAN, "entries", copied)
	}
}

// resumeReaper queues again the removals a crash interrupted, their class
// minors reserved until done.
func (p *NICPreparer) resumeReaper(ctx context.Context) {
	items, err := p.reaper.resume()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the reaper's queue; shares it held may need removing by hand")
		return
	}
	queued := map[string]bool{}
	for _, it := range items {
		p.reserveMinors(it.Key, it.Parent, it.EgressMinor, it.IngressMinor, it.FlowClasses)
		queued[p.specPath(it.Link)+reapingSuffix] = true
	}
	// Specs set aside for a reaping that no queue holds (an earlier
	// boot's, whose queue was dropped) describe nothing left.
	aside, _ := filepath.Glob(filepath.Join(p.opts.StateDir, "netdev", "*"+reapingSuffix))
	for _, f := range aside {
		if !queued[f] {
			_ = os.Remove(f)
		}
	}
	if len(items) > 0 {
		klog.FromContext(ctx).Info("Resuming the removal of unprepared shares", "count", len(items))
	}
}

// reserveMinors marks a share's class minors as taken. Minors are per
// device: egress classes live on the parent's egress shaper, ingress ones
// on its IFB.
func (p *NICPreparer) reserveMinors(key, parentName string, egress, ingress uint16, flows bool) {
	ifb, shaper := "", ""
	if parent, err := p.h.LinkByName(parentName); err == nil {
		ifb, shaper = ifbName(parent), egressShaperName(parent.Attrs().Index)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if egress != 0 && shaper != "" {
		p.reserveBlock(shaper, key, egress, flows)
	}
	if ingress != 0 && ifb != "" {
		p.reserveBlock(ifb, key, ingress, flows)
	}
}

// specPath is where the attach spec of the share whose link is link lives.
func (p *NICPreparer) specPath(link string) string {
	return filepath.Join(p.opts.StateDir, "netdev", link+".json")
}

// hookArgs is the hook's argv before its flags.
func (p *NICPreparer) hookArgs() []string {
	if len(p.opts.HookArgs) > 0 {
		return p.opts.HookArgs
	}
	return []string{"carve", "hook", "netns-attach"}
}

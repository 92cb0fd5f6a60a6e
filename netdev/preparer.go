package netdev

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf"
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

// NICPreparer prepares NIC allocations.
type NICPreparer struct {
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
	// noFQCodel is set once adding fq_codel failed: leaves are bfifos.
	noFQCodel bool
	// tcMu orders the changes of parents' qdiscs: two shares of one
	// parent unprepared at once would each see the other's class and
	// both leave the parent's HTB and IFB behind, and a prepare could
	// add a class to a qdisc an unprepare is removing.
	tcMu sync.Mutex
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
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "netdev"), 0o755); err != nil {
		return nil, err
	}
	return &NICPreparer{opts: opts, h: h, ipam: newIPAM(), minors: map[string]map[uint16]string{}, labels: map[string]shareLabels{}}, nil
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
func (p *NICPreparer) Restore(allocs []prepare.Allocation, undos []json.RawMessage) {
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
	pods, err := p.opts.Shaper.PodShares()
	if err != nil {
		return
	}
	for _, ps := range pods {
		if !keep[ps.MAC] {
			if mac, err := net.ParseMAC(ps.MAC); err == nil {
				_ = p.opts.Shaper.DeletePodShares(mac)
			}
		}
	}
}

// specPath is where the attach spec of the share whose link is link lives.
func (p *NICPreparer) specPath(link string) string {
	return filepath.Join(p.opts.StateDir, "netdev", link+".json")
}

package sharelist

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
)

// kernelNode is node on the running kernel: the classifier's pins opened
// read-only, and netlink in the node's network namespace.
type kernelNode struct {
	pinDir string
	pinned *bpf.Pinned
	pinErr error
	h      *netlink.Handle
	ino    uint64
}

// openNode opens the node's network namespace (that of <root>/proc/1, as
// the agent's default, else this process's) and the pins under pinDir. Pins
// that do not exist are not an error: the shares that need them are then
// reported as not enforced.
func openNode(root, pinDir string) (*kernelNode, error) {
	ns, err := netns.GetFromPath(filepath.Join(root, "proc/1/ns/net"))
	if err != nil {
		if ns, err = netns.Get(); err != nil {
			return nil, fmt.Errorf("network namespace: %w", err)
		}
	}
	defer ns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in the node's network namespace: %w", err)
	}
	n := &kernelNode{h: h, ino: st.Ino, pinDir: pinDir}
	n.pinned, n.pinErr = bpf.OpenPinned(pinDir)
	if errors.Is(n.pinErr, os.ErrNotExist) {
		n.pinErr = fmt.Errorf("nothing pinned under %s: not the agent's --bpf-pin-dir (the chart sets CARVE_BPF_PIN_DIR in the agent's container), or the agent never shaped a share here", pinDir)
	}
	return n, nil
}

func (n *kernelNode) close() {
	n.h.Close()
	if n.pinned != nil {
		n.pinned.Close()
	}
}

func (n *kernelNode) mapsErr() error                           { return n.pinErr }
func (n *kernelNode) podGuard(name string) (string, error)     { return bpf.PodGuardState(n.pinDir, name) }
func (n *kernelNode) shares() (map[bpf.Key]uint32, error)      { return n.pinned.Shares() }
func (n *kernelNode) stats() (map[bpf.Key]bpf.Counters, error) { return n.pinned.Stats() }
func (n *kernelNode) rates() (map[string]uint64, error)        { return n.pinned.Rates() }
func (n *kernelNode) spoofDrops() (map[string]bpf.SpoofDrops, error) {
	return n.pinned.SpoofDrops()
}
func (n *kernelNode) links() ([]bpf.PinnedLink, error)     { return n.pinned.PinnedLinks() }
func (n *kernelNode) shareAddrs() ([]bpf.AddrShare, error) { return n.pinned.ShareAddrs() }
func (n *kernelNode) egressShapers() (map[int]bpf.EgressShaperLinks, error) {
	return n.pinned.EgressShapers()
}
func (n *kernelNode) netnsIno() uint64 { return n.ino }

func (n *kernelNode) linkIndex(name string) (int, error) {
	l, err := n.h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

func (n *kernelNode) classDrops(ifindex int) (map[uint32]uint64, error) {
	dev := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	classes, err := n.h.ClassList(dev, netlink.MakeHandle(1, 0))
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]uint64, len(classes))
	for _, c := range classes {
		var drops uint64
		if s := c.Attrs().Statistics; s != nil && s.Queue != nil {
			drops = uint64(s.Queue.Drops)
		}
		out[c.Attrs().Handle] += drops
		// A share's flow children (netdev/flows.go) count their drops
		// as the share's: HTB counts drops at leaves only.
		if pmajor, pminor := netlink.MajorMinor(c.Attrs().Parent); pmajor == 1 && pminor != 0 {
			out[c.Attrs().Parent] += drops
		}
	}
	return out, nil
}

func (n *kernelNode) aqm() (map[bpf.Key]bpf.AQMCounters, error) { return n.pinned.AQM() }

func (n *kernelNode) classQueues(ifindex int) (map[uint32]string, error) {
	dev := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	classes, err := n.h.ClassList(dev, netlink.MakeHandle(1, 0))
	if err != nil {
		return nil, err
	}
	qdiscs, err := n.h.QdiscList(dev)
	if err != nil {
		return nil, err
	}
	leaves := make(map[uint32]string, len(qdiscs))
	for _, q := range qdiscs {
		leaves[q.Attrs().Parent] = q.Type()
	}
	out := make(map[uint32]string, len(classes))
	for _, c := range classes {
		if pmajor, pminor := netlink.MajorMinor(c.Attrs().Parent); pmajor == 1 && pminor != 0 {
			out[c.Attrs().Parent] = "flows+codel" // netdev/flows.go's children
		} else if _, ok := out[c.Attrs().Handle]; !ok {
			out[c.Attrs().Handle] = cmp.Or(leaves[c.Attrs().Handle], "pfifo")
		}
	}
	return out, nil
}

func (n *kernelNode) legacyFilter(ifindex int, ingress bool, name string) bool {
	hook := uint32(netlink.HANDLE_MIN_EGRESS)
	if ingress {
		hook = netlink.HANDLE_MIN_INGRESS
	}
	filters, err := n.h.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, hook)
	if err != nil {
		return false
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == name {
			return true
		}
		// Without TCX the ingress redirect is act_mirred's (bpf.AttachRedirect).
		if ingress && name == bpf.LegacyFilterName("redirect_ingress") && bpf.IsLegacyRedirect(f) {
			return true
		}
	}
	return false
}

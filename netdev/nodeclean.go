package netdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// What carve leaves on a node between shares, and removes when it is
// uninstalled (RemoveNodeLinks): each parent's ingress IFB and egress shaper
// pair, with the classes parked on them, and a share's interface that is
// still on the node (a prepared share before its pod starts, or one the
// reaper has not removed yet). They are told apart from an operator's links
// by name and kind together: a link named like carve's of another kind is
// left alone.
var nodeLinkKinds = []struct {
	name *regexp.Regexp
	kind []string
}{
	{regexp.MustCompile(`^cvifb[0-9]+$`), []string{"ifb"}},
	{regexp.MustCompile(`^cveg[0-9]+r?$`), []string{"veth"}},
	{regexp.MustCompile(`^cv[0-9a-f]{10}$`), []string{"macvlan", "ipvlan"}},
	// A parent's VLAN interface that shares in a VLAN are made on
	// (ensureVLAN).
	{regexp.MustCompile(`^cv[0-9]+\.[0-9]+$`), []string{"vlan"}},
}

// isNodeLink reports whether l is one of carve's links on the node.
func isNodeLink(l netlink.Link) bool {
	for _, k := range nodeLinkKinds {
		if k.name.MatchString(l.Attrs().Name) && slices.Contains(k.kind, l.Type()) {
			return true
		}
	}
	return false
}

// RemoveNodeLinks deletes carve's links from the namespace of h (the
// node's): the parents' IFBs and egress shaper pairs (their qdiscs, classes
// and redirects go with them) and shares' interfaces left on the node. It
// returns the names it removed. A link that is gone already is no error.
func RemoveNodeLinks(h *netlink.Handle) ([]string, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the node's links: %w", err)
	}
	var removed []string
	var errs []error
	for _, l := range links {
		if !isNodeLink(l) {
			continue
		}
		err := h.LinkDel(l)
		switch {
		case err == nil:
			removed = append(removed, l.Attrs().Name)
		case errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENOENT):
			// A veth pair's peer goes with its first end.
		default:
			errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
		}
	}
	return removed, errors.Join(errs...)
}

// RemoveShareLinksInPods deletes, in every network namespace of a process
// under root other than host's, the links whose MAC is one of macs: the
// interfaces of NIC shares still in their pods. A forced uninstall removes
// them, so that no pod goes on sending unshaped through a share whose
// enforcement was taken away. It returns "<pid>:<link>" for each link
// removed. Namespaces that cannot be read (a process that exited) are
// skipped.
func RemoveShareLinksInPods(root string, host netns.NsHandle, macs []string) ([]string, error) {
	if len(macs) == 0 {
		return nil, nil
	}
	want := map[string]bool{}
	for _, m := range macs {
		want[strings.ToLower(m)] = true
	}
	var hostIno uint64
	var st unix.Stat_t
	if err := unix.Fstat(int(host), &st); err == nil {
		hostIno = st.Ino
	}
	procs, err := os.ReadDir(filepath.Join(root, "proc"))
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	seen := map[uint64]bool{hostIno: true}
	var removed []string
	var errs []error
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		path := filepath.Join(root, "proc", p.Name(), "ns", "net")
		if err := unix.Stat(path, &st); err != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		ns, err := netns.GetFromPath(path)
		if err != nil {
			continue
		}
		names, err := removeLinksByMAC(ns, want)
		ns.Close()
		for _, n := range names {
			removed = append(removed, p.Name()+":"+n)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("network namespace of pid %s: %w", p.Name(), err))
		}
	}
	return removed, errors.Join(errs...)
}

func removeLinksByMAC(ns netns.NsHandle, macs map[string]bool) ([]string, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, l := range links {
		if !macs[strings.ToLower(l.Attrs().HardwareAddr.String())] {
			continue
		}
		if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
			continue
		}
		removed = append(removed, l.Attrs().Name)
	}
	return removed, errors.Join(errs...)
}

package netdev

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

// Links a pod nests on its share's interface. A macvlan, macvtap, ipvlan or
// ipvtap made on a share's interface (itself a macvlan or ipvlan) lands on
// the share's parent, the node's NIC: the kernel gives it the parent as its
// lower device, in the pod's namespace. It has a MAC or addresses of its
// own that no classifier entry names, and a macvlan in source mode receives
// frames meant for others (a gateway's, say). Only a pod with CAP_NET_ADMIN
// can make one, and only in a class that allows it (allowNetAdmin), but
// that is no licence to tap the segment: the agent removes every such link
// in a share's pod whose lower device is one of the pod's shares' (the
// parent, or the share's VLAN device on it), but the shares' own
// interfaces. Links on other lower devices (another CNI's macvlan on
// another NIC) are left.
//
// What is watched is the pods that hold shares of such classes on this
// node, and nothing else: the node's own namespace (the host's own children
// of a parent, a bond's or a bridge's) and other pods (another CNI's
// macvlans) are never touched. A share's pod is found through the
// classifier's pod map, whose netns cookies the hook recorded, matched
// against the namespaces of the node's processes (<root>/proc/*/ns/net) and
// the pinned ones (<root>/run/netns, where the container runtime keeps its
// sandboxes'). Its links are then listed every NestedLinkOptions.Interval:
// a nested link lives at most that long, once its pod is found.

// nestedKinds are the link kinds whose lower device can be the node's NIC
// from inside a pod.
var nestedKinds = map[string]bool{"macvlan": true, "macvtap": true, "ipvlan": true, "ipvtap": true}

// NestedLinkOptions configure WatchNestedLinks.
type NestedLinkOptions struct {
	// Root is the host's root (/ in production).
	Root string
	// Interval is how often the pod map is read for new share pods.
	Interval time.Duration
	// OnRemoved is told of each link removed, with the claim of the
	// share whose pod made it ("namespace/name").
	OnRemoved func(ctx context.Context, claim, link, kind string)
}

// NestedLinksRemoved is how many links WatchNestedLinks removed, by the
// share's MAC.
func (p *NICPreparer) NestedLinksRemoved() map[string]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.nestedRemoved)
}

// WatchNestedLinks removes, until ctx ends, the links the pods of shares
// whose class allows NET_ADMIN nest on the node's NICs (only a container
// with it can make one). It needs the classifier (a shaped node); without
// it, it returns at once.
//
// It polls: every Interval it lists each such pod's links, through a
// handle on the pod's namespace that it closes again. A netlink
// subscription would keep the namespace alive for as long as it lasts:
// measured, a pod whose sandbox was made again could not bring its share's
// interface up in the new one (EADDRINUSE: the old one, with the same MAC,
// still on the parent in the old namespace), and its hook failed for ever,
// since the pod's new entry, which ended the watch, comes only after it.
func (p *NICPreparer) WatchNestedLinks(ctx context.Context, opts NestedLinkOptions) {
	if p.opts.Shaper == nil {
		return
	}
	if opts.Interval <= 0 {
		opts.Interval = 500 * time.Millisecond
	}
	w := &nestedWatch{p: p, opts: opts, paths: map[uint64]nsPath{}}
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		w.scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type nestedWatch struct {
	p    *NICPreparer
	opts NestedLinkOptions
	// paths are where each watched pod's namespace was found, by its
	// cookie.
	paths map[uint64]nsPath
	// cookies caches the cookies of the namespaces seen, by inode, so
	// that finding a pod's namespace enters only namespaces not seen; it
	// is emptied every cookieCacheScans searches, as a dead namespace's
	// inode number may be given to a new one.
	cookies  map[uint64]uint64
	searches int
}

// nsPath is a path to a namespace, and the namespace's inode.
type nsPath struct {
	path string
	ino  uint64
}

const cookieCacheScans = 20

// current reports whether the path still names the namespace found there.
func (p nsPath) current() bool {
	var st unix.Stat_t
	return unix.Stat(p.path, &st) == nil && st.Ino == p.ino
}

// scan checks the links of every watched pod, finding the namespaces of
// the pods not found before, or moved.
func (w *nestedWatch) scan(ctx context.Context) {
	shares, err := w.p.opts.Shaper.PodShares()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the classifier's pod map; nested links are not watched")
		return
	}
	// Every share of a pod that holds one of such a class: a pod may hold
	// shares of several parents, whose own interfaces all stay.
	byPod := map[uint64][]bpf.PodShare{}
	watched := map[uint64]bool{}
	for _, s := range shares {
		byPod[s.NetnsCookie] = append(byPod[s.NetnsCookie], s)
		if w.p.allowsNetAdmin(s.MAC) {
			watched[s.NetnsCookie] = true
		}
	}
	want := map[uint64][]bpf.PodShare{}
	for cookie := range watched {
		want[cookie] = byPod[cookie]
	}
	missing := false
	for cookie, path := range w.paths {
		if _, ok := want[cookie]; !ok || !path.current() {
			delete(w.paths, cookie)
		}
	}
	for cookie := range want {
		if _, ok := w.paths[cookie]; !ok {
			missing = true
		}
	}
	if missing {
		if w.searches++; w.cookies == nil || w.searches%cookieCacheScans == 0 {
			w.cookies = map[uint64]uint64{}
		}
		for cookie, path := range namespacesByCookie(w.opts.Root, w.cookies, func(c uint64) bool {
			_, ok := want[c]
			_, found := w.paths[c]
			return ok && !found
		}) {
			w.paths[cookie] = path
		}
	}
	for cookie, path := range w.paths {
		if !w.checkPod(ctx, path, cookie, want[cookie]) {
			delete(w.paths, cookie)
		}
	}
}

// lowerDevice is where a link's lower device is: the namespace (its id as
// the pod sees it) and the ifindex there.
type lowerDevice struct {
	netnsID int
	index   int
}

// ownInterface is a share's own interface in its pod.
type ownInterface struct {
	share       bpf.PodShare
	name, claim string // the share's link name and claim
}

// checkPod removes the links in the pod (the namespace at path, whose
// cookie must still be cookie) nested on its shares' lower devices. It
// reports false where the namespace at path is no longer the pod's (a
// dead namespace's inode given to another): nothing is removed there.
func (w *nestedWatch) checkPod(ctx context.Context, path nsPath, cookie uint64, shares []bpf.PodShare) bool {
	ns, err := netns.GetFromPath(path.path)
	if err != nil {
		return false // gone since: found again, or dropped, at the next scan
	}
	defer ns.Close()
	var got uint64
	if err := hook.InNetns(ns, func() (err error) { got, err = bpf.NetnsCookie(); return err }); err != nil || got != cookie {
		return false
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Netlink in a share's pod", "err", err)
		return true
	}
	defer h.Close()
	// Each share's own interface, by the ifindex its pod guard is
	// attached to; while one is not attached yet, or unprepared, the pod
	// waits for the next scan: its links cannot be told apart.
	own := map[int]ownInterface{}
	for _, s := range shares {
		name, claim := w.p.shareOf(s.MAC)
		if name == "" {
			return true
		}
		idx, err := bpf.PodGuardIfindex(w.p.opts.PinDir, name)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				klog.FromContext(ctx).Error(err, "Reading a share's pod guard; links nested in its pod are left", "share", name)
			}
			return true
		}
		own[idx] = ownInterface{share: s, name: name, claim: claim}
	}
	links, err := h.LinkList()
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Listing a share's pod's links", "err", err)
		return true
	}
	// The lower devices of the shares' own interfaces, and whose each is.
	lowers := map[lowerDevice]ownInterface{}
	for _, l := range links {
		if o, ok := own[l.Attrs().Index]; ok && l.Attrs().NetNsID >= 0 {
			lowers[lowerDevice{l.Attrs().NetNsID, l.Attrs().ParentIndex}] = o
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if a == nil || !nestedKinds[l.Type()] || a.NetNsID < 0 {
			continue // its lower device is in the pod, or it has none
		}
		if _, mine := own[a.Index]; mine {
			continue
		}
		if o, ok := lowers[lowerDevice{a.NetNsID, a.ParentIndex}]; ok {
			w.remove(ctx, h, o, l)
		}
	}
	return true
}

// remove deletes l, nested in o's pod on o's lower device.
func (w *nestedWatch) remove(ctx context.Context, h *netlink.Handle, o ownInterface, l netlink.Link) {
	a, name, claim, share := l.Attrs(), o.name, o.claim, o.share
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		klog.FromContext(ctx).Error(err, "Removing a link nested on a share's parent", "share", name, "claim", claim, "link", a.Name, "kind", l.Type())
		return
	}
	w.p.mu.Lock()
	if w.p.nestedRemoved == nil {
		w.p.nestedRemoved = map[string]uint64{}
	}
	w.p.nestedRemoved[share.MAC]++
	w.p.mu.Unlock()
	klog.FromContext(ctx).Info("Removed a link a pod nested on its share's parent", "share", name, "claim", claim, "link", a.Name, "kind", l.Type())
	if w.opts.OnRemoved != nil {
		w.opts.OnRemoved(ctx, claim, a.Name, l.Type())
	}
}

// shareOf is the link name and claim ("namespace/name") of the share with
// mac, "" where no prepared share has it.
func (p *NICPreparer) shareOf(mac string) (name, claim string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.labels[mac]
	if !ok {
		return "", ""
	}
	return l.link, l.claim
}

// allowsNetAdmin reports whether the share with mac is of a class that lets
// its pods' containers have CAP_NET_ADMIN.
func (p *NICPreparer) allowsNetAdmin(mac string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.labels[mac].netAdmin
}

// namespacesByCookie finds the network namespaces of the node's processes
// and its pinned ones (<root>/run/netns) whose cookie wanted accepts, each
// once, by a path to each. cookies caches what namespaces were found to be,
// by inode: those are not entered again.
func namespacesByCookie(root string, cookies map[uint64]uint64, wanted func(uint64) bool) map[uint64]nsPath {
	out := map[uint64]nsPath{}
	seen := map[uint64]bool{}
	try := func(path string) {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		cookie, ok := cookies[st.Ino]
		if !ok {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				return
			}
			err = hook.InNetns(ns, func() (err error) { cookie, err = bpf.NetnsCookie(); return err })
			ns.Close()
			if err != nil {
				return
			}
			cookies[st.Ino] = cookie
		}
		if _, dup := out[cookie]; wanted(cookie) && !dup {
			out[cookie] = nsPath{path: path, ino: st.Ino}
		}
	}
	if pinned, err := os.ReadDir(filepath.Join(root, "run", "netns")); err == nil {
		for _, e := range pinned {
			try(filepath.Join(root, "run", "netns", e.Name()))
		}
	}
	procs, _ := os.ReadDir(filepath.Join(root, "proc"))
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			try(filepath.Join(root, "proc", e.Name(), "ns", "net"))
		}
	}
	return out
}

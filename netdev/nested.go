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
// in a share's pod but the share's own interface.
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
	want := map[uint64]bpf.PodShare{}
	for _, s := range shares {
		if w.p.allowsNetAdmin(s.MAC) {
			want[s.NetnsCookie] = s
		}
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
		w.checkPod(ctx, path, want[cookie])
	}
}

// checkPod removes the links share's pod, in the namespace at path, nested
// on the node's NIC.
func (w *nestedWatch) checkPod(ctx context.Context, path nsPath, share bpf.PodShare) {
	ns, err := netns.GetFromPath(path.path)
	if err != nil {
		return // gone since: found again, or dropped, at the next scan
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Netlink in a share's pod", "share", share.MAC, "err", err)
		return
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Listing a share's pod's links", "share", share.MAC, "err", err)
		return
	}
	for _, l := range links {
		w.check(ctx, h, share, l)
	}
}

// check removes l if it is a link on the node's NIC that is not the share's
// own interface (the one its pod guard is attached to).
func (w *nestedWatch) check(ctx context.Context, h *netlink.Handle, share bpf.PodShare, l netlink.Link) {
	a := l.Attrs()
	if a == nil || !nestedKinds[l.Type()] || a.NetNsID < 0 {
		return // its lower device is in the pod, or it has none
	}
	name, claim := w.p.shareOf(share.MAC)
	if name == "" {
		return // unprepared meanwhile
	}
	own, err := bpf.PodGuardIfindex(w.p.opts.PinDir, name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		klog.FromContext(ctx).Error(err, "Reading a share's pod guard; a link nested in its pod is left", "share", name, "link", a.Name)
		return
	}
	if errors.Is(err, os.ErrNotExist) || a.Index == own {
		return // the hook has not attached it yet; or the share's own
	}
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

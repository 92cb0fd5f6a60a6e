package netdev

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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
// What is watched is the pods that hold shares on this node, and nothing
// else: the node's own namespace (the host's own children of a parent, a
// bond's or a bridge's) and other pods (another CNI's macvlans) are never
// touched. A share's pod is found through the classifier's pod map, whose
// netns cookies the hook recorded, matched against the namespaces of the
// node's processes (<root>/proc/*/ns/net) and the pinned ones
// (<root>/run/netns, where the container runtime keeps its sandboxes').
// Each is then watched through a netlink subscription of its own, which
// lists what is already there: a nested link lives at most until the next
// scan finds its pod (NestedLinkOptions.Interval) or, after that, for as long
// as the agent takes to read the event.

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

// WatchNestedLinks removes, until ctx ends, the links share pods nest on the
// node's NICs. It needs the classifier (a shaped node); without it, it
// returns at once.
func (p *NICPreparer) WatchNestedLinks(ctx context.Context, opts NestedLinkOptions) {
	if p.opts.Shaper == nil {
		return
	}
	if opts.Interval <= 0 {
		opts.Interval = 500 * time.Millisecond
	}
	w := &nestedWatch{p: p, opts: opts, watched: map[uint64]context.CancelFunc{}}
	t := time.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		w.scan(ctx)
		select {
		case <-ctx.Done():
			w.stopAll()
			return
		case <-t.C:
		}
	}
}

type nestedWatch struct {
	p    *NICPreparer
	opts NestedLinkOptions
	// watched holds a subscription's cancel by the pod namespace's
	// cookie.
	watched map[uint64]context.CancelFunc
	// cookies caches the cookies of the namespaces seen, by inode, so
	// that a scan enters only namespaces it has not seen; it is emptied
	// every cookieCacheScans scans, as a dead namespace's inode number
	// may be given to a new one.
	cookies map[uint64]uint64
	scans   int
	wg      sync.WaitGroup
}

const cookieCacheScans = 20

// scan starts watching the share pods not yet watched, and stops watching
// those whose shares are gone.
func (w *nestedWatch) scan(ctx context.Context) {
	logger := klog.FromContext(ctx)
	shares, err := w.p.opts.Shaper.PodShares()
	if err != nil {
		logger.Error(err, "Reading the classifier's pod map; nested links are not watched")
		return
	}
	want := map[uint64]bpf.PodShare{}
	for _, s := range shares {
		want[s.NetnsCookie] = s
	}
	for cookie, cancel := range w.watched {
		if _, ok := want[cookie]; !ok {
			cancel()
			delete(w.watched, cookie)
		}
	}
	var missing bool
	for cookie := range want {
		if _, ok := w.watched[cookie]; !ok {
			missing = true
		}
	}
	if !missing {
		return
	}
	if w.scans++; w.scans%cookieCacheScans == 0 {
		w.cookies = nil
	}
	if w.cookies == nil {
		w.cookies = map[uint64]uint64{}
	}
	for cookie, ns := range namespacesByCookie(w.opts.Root, w.cookies, func(c uint64) bool {
		_, ok := want[c]
		return ok && w.watched[c] == nil
	}) {
		wctx, cancel := context.WithCancel(ctx)
		w.watched[cookie] = cancel
		share := want[cookie]
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.watch(wctx, ns, share)
		}()
	}
}

func (w *nestedWatch) stopAll() {
	for _, cancel := range w.watched {
		cancel()
	}
	w.wg.Wait()
}

// watch removes nested links in the pod namespace ns of share until ctx
// ends; it owns ns. A subscription that fails is made again, listing the
// namespace's links anew.
func (w *nestedWatch) watch(ctx context.Context, ns netns.NsHandle, share bpf.PodShare) {
	defer ns.Close()
	logger := klog.FromContext(ctx).WithValues("share", share.MAC)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		logger.Error(err, "Netlink in a share's pod; its nested links are not watched")
		return
	}
	defer h.Close()
	for ctx.Err() == nil {
		updates := make(chan netlink.LinkUpdate, 64)
		done := make(chan struct{})
		err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &ns, ListExisting: true,
			ErrorCallback: func(err error) { logger.V(2).Info("Link subscription in a share's pod", "err", err) }})
		if err != nil {
			logger.Error(err, "Subscribing to a share's pod's links; retrying")
			close(done)
		} else {
		read:
			for {
				select {
				case <-ctx.Done():
					close(done)
					return
				case u, ok := <-updates:
					if !ok {
						close(done)
						break read
					}
					if u.Header.Type == unix.RTM_NEWLINK {
						w.check(ctx, h, share, u.Link)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.opts.Interval):
		}
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

// namespacesByCookie opens the network namespaces of the node's processes
// and its pinned ones (<root>/run/netns) whose cookie wanted accepts, each
// once. cookies caches what namespaces were found to be, by inode: those
// are not entered again. The caller owns the handles.
func namespacesByCookie(root string, cookies map[uint64]uint64, wanted func(uint64) bool) map[uint64]netns.NsHandle {
	out := map[uint64]netns.NsHandle{}
	seen := map[uint64]bool{}
	try := func(path string) {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		if c, ok := cookies[st.Ino]; ok && !wanted(c) {
			return
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			return
		}
		var cookie uint64
		if err := hook.InNetns(ns, func() (err error) { cookie, err = bpf.NetnsCookie(); return err }); err != nil {
			ns.Close()
			return
		}
		cookies[st.Ino] = cookie
		if !wanted(cookie) || out[cookie] != 0 {
			ns.Close()
			return
		}
		out[cookie] = ns
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

package netdev

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
)

// linkSubscriber is netlink.LinkSubscribeWithOptions; tests replace it to
// make the subscription die.
type linkSubscriber func(ch chan<- netlink.LinkUpdate, done <-chan struct{}, opts netlink.LinkSubscribeOptions) error

// WatchLinks reports the links of the network namespace ns that were added,
// removed or changed state: C receives whenever there is something to Take,
// coalescing bursts (the receiver rescans, it does not need every event).
// carve's own links (a share's interface, a parent's IFB or VLAN:
// discovery.IsCarveLink) are never published, so their events are not
// reported: each prepare and unprepare would otherwise rediscover the whole
// node several times. If the subscription dies (the netlink socket fails, for
// example on ENOBUFS), it is made again and every link is reported changed,
// since events may have been missed meanwhile.
func WatchLinks(ctx context.Context, ns netns.NsHandle) (*LinkChanges, error) {
	return watchLinks(ctx, ns, netlink.LinkSubscribeWithOptions, time.Second)
}

// LinkChanges are the link changes seen since they were last taken.
type LinkChanges struct {
	// C receives when there are changes to take.
	C     <-chan struct{}
	c     chan struct{}
	mu    sync.Mutex
	names map[string]bool
	all   bool
}

// Take returns the names of the links changed since the last Take; all is
// true where any link may have changed (events were lost, or one named no
// link).
func (l *LinkChanges) Take() (names []string, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := range l.names {
		names = append(names, n)
	}
	all, l.names, l.all = l.all, map[string]bool{}, false
	return names, all
}

// add records an update that changes what discovery reads; nil is a
// change of any link.
func (l *LinkChanges) add(u *netlink.LinkUpdate) {
	l.mu.Lock()
	if u == nil || u.Link == nil || u.Attrs() == nil {
		l.all = true
	} else {
		l.names[u.Attrs().Name] = true
	}
	l.mu.Unlock()
	select {
	case l.c <- struct{}{}:
	default:
	}
}

// relevant reports whether an update can change what discovery finds.
func relevant(u netlink.LinkUpdate) bool {
	return u.Link == nil || u.Attrs() == nil || !discovery.IsCarveLink(u.Attrs().Name)
}

// linkFacts are what discovery reads of a link through netlink's eyes.
// The kernel sends a parent an RTM_NEWLINK each time a child is added or
// removed (a share's macvlan), with none of these changed; those must not
// rediscover the node.
type linkFacts struct {
	name, kind, mac string
	up              bool
	oper            netlink.LinkOperState
	mtu, master     int
	vfs             int
}

func factsOf(l netlink.Link) linkFacts {
	a := l.Attrs()
	return linkFacts{name: a.Name, kind: l.Type(), mac: a.HardwareAddr.String(), up: a.Flags&net.FlagUp != 0,
		oper: a.OperState, mtu: a.MTU, master: a.MasterIndex, vfs: len(a.Vfs)}
}

// changes tracks the links seen, by ifindex, and tells which updates change
// something discovery reads.
type changes map[int32]linkFacts

func (c changes) changed(u netlink.LinkUpdate) bool {
	if !relevant(u) {
		return false
	}
	if u.Link == nil || u.Attrs() == nil {
		return true
	}
	idx := u.Index
	if u.Header.Type == unix.RTM_DELLINK {
		delete(c, idx)
		return true
	}
	f := factsOf(u.Link)
	if old, ok := c[idx]; ok && old == f {
		return false
	}
	c[idx] = f
	return true
}

func watchLinks(ctx context.Context, ns netns.NsHandle, subscribe linkSubscriber, retry time.Duration) (*LinkChanges, error) {
	logger := klog.FromContext(ctx)
	open := func() (chan netlink.LinkUpdate, chan struct{}, error) {
		updates := make(chan netlink.LinkUpdate, 64)
		done := make(chan struct{})
		err := subscribe(updates, done, netlink.LinkSubscribeOptions{
			Namespace:     &ns,
			ErrorCallback: func(err error) { logger.Error(err, "Netlink link subscription") },
		})
		if err != nil {
			close(done)
			return nil, nil, fmt.Errorf("subscribe to link events: %w", err)
		}
		return updates, done, nil
	}
	updates, done, err := open()
	if err != nil {
		return nil, err
	}
	c := make(chan struct{}, 1)
	changed := &LinkChanges{C: c, c: c, names: map[string]bool{}}
	seen := changes{}
	go func() {
		defer func() { close(done) }()
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-updates:
				if ok {
					if seen.changed(u) {
						changed.add(&u)
					}
					continue
				}
				logger.Info("Link event subscription ended; subscribing again")
				clear(seen) // events may have been missed
				close(done)
				for {
					select {
					case <-ctx.Done():
						done = make(chan struct{})
						return
					case <-time.After(retry):
					}
					if updates, done, err = open(); err == nil {
						break
					}
					logger.Error(err, "Resubscribing to link events")
				}
				changed.add(nil)
			}
		}
	}()
	return changed, nil
}

package netdev

import (
	"context"
	"fmt"
	"net"
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

// WatchLinks sends on the returned channel whenever a link of the network
// namespace ns is added, removed or changes state, coalescing bursts:
// the receiver rescans, it does not need every event. carve's own links (a
// share's interface, a parent's IFB or VLAN: discovery.IsCarveLink) are
// never published, so their events are not sent: each prepare and unprepare
// would otherwise rediscover the whole node several times. If the subscription
// dies (the netlink socket fails, for example on ENOBUFS), it is made again
// and a change is signalled, since events may have been missed meanwhile.
func WatchLinks(ctx context.Context, ns netns.NsHandle) (<-chan struct{}, error) {
	return watchLinks(ctx, ns, netlink.LinkSubscribeWithOptions, time.Second)
}

// relevant reports whether an update can change what discovery finds.
func relevant(u netlink.LinkUpdate) bool {
	return u.Link == nil || u.Link.Attrs() == nil || !discovery.IsCarveLink(u.Link.Attrs().Name)
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
	if u.Link == nil || u.Link.Attrs() == nil {
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

func watchLinks(ctx context.Context, ns netns.NsHandle, subscribe linkSubscriber, retry time.Duration) (<-chan struct{}, error) {
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
	changed := make(chan struct{}, 1)
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
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
						signal()
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
				signal()
			}
		}
	}()
	return changed, nil
}

package netdev

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"
)

// linkSubscriber is netlink.LinkSubscribeWithOptions; tests replace it to
// make the subscription die.
type linkSubscriber func(ch chan<- netlink.LinkUpdate, done <-chan struct{}, opts netlink.LinkSubscribeOptions) error

// WatchLinks sends on the returned channel whenever a link of the network
// namespace ns is added, removed or changes state, coalescing bursts:
// the receiver rescans, it does not need every event. If the subscription
// dies (the netlink socket fails, for example on ENOBUFS), it is made again
// and a change is signalled, since events may have been missed meanwhile.
func WatchLinks(ctx context.Context, ns netns.NsHandle) (<-chan struct{}, error) {
	return watchLinks(ctx, ns, netlink.LinkSubscribeWithOptions, time.Second)
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
	go func() {
		defer func() { close(done) }()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-updates:
				if ok {
					signal()
					continue
				}
				logger.Info("Link event subscription ended; subscribing again")
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

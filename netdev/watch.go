package netdev

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"
)

// WatchLinks sends on the returned channel whenever a link of the network
// namespace ns is added, removed or changes state, coalescing bursts:
// the receiver rescans, it does not need every event.
func WatchLinks(ctx context.Context, ns netns.NsHandle) (<-chan struct{}, error) {
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(err error) { klog.FromContext(ctx).Error(err, "Netlink link subscription") },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to link events: %w", err)
	}
	changed := make(chan struct{}, 1)
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-updates:
				if !ok {
					return
				}
				select {
				case changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	return changed, nil
}

package app

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/klog/v2"
)

// nestedLinkEvents records a Warning Event on each pod of the claim whose
// pod nested a link on the node's NIC (netdev.WatchNestedLinks removed
// it): the pod's owner sees why its link went. Without an API client
// the removal is only logged and counted.
func nestedLinkEvents(opts Options) func(ctx context.Context, claim, link, kind string) {
	if opts.KubeClient == nil {
		return nil
	}
	owners := claimOwners{client: opts.KubeClient}
	events := podEvents(opts.KubeClient, opts.NodeName)
	return func(ctx context.Context, claim, link, kind string) {
		namespace, name, _ := strings.Cut(claim, "/")
		pods, err := owners.ReservedPods(ctx, namespace, name)
		if err != nil {
			klog.FromContext(ctx).Error(err, "No Event for a removed nested link: the claim's pods are unknown", "claim", claim, "link", link)
			return
		}
		for _, pod := range pods {
			events.PodEvent(pod, "NestedLinkRemoved", fmt.Sprintf("carve removed %s %s, which the pod nested on its NIC share (claim %s): "+
				"a link there lands on the node's NIC, outside the share's checks", kind, link, claim))
		}
	}
}

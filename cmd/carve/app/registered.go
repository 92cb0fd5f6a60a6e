package app

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// awaitRegistration waits, up to wait, until the kubelet has registered the
// plugin. ResourceSlices published before that let the scheduler place pods
// whose claims the kubelet cannot prepare yet ("DRA driver ... is not
// registered"); the kubelet then retries them on its pod back-off, which
// was 70 s for a pod placed one second before the registration (the local
// cluster's kubelet, v1.37). The kubelet's plugin watcher registers a new
// socket within about a second, so the wait is short where a kubelet is;
// where none answers, the devices are published anyway once it runs out.
func awaitRegistration(ctx context.Context, helper *kubeletplugin.Helper, wait time.Duration) {
	if wait <= 0 {
		return
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		if st := helper.RegistrationStatus(); st != nil && st.PluginRegistered {
			logger.V(1).Info("Registered with the kubelet", "after", time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			reason := "the kubelet has not called the registration socket"
			if st := helper.RegistrationStatus(); st != nil {
				reason = "the kubelet reported: " + st.Error
			}
			logger.Info("Not registered with the kubelet yet; publishing the node's devices anyway", "waited", wait, "reason", reason)
			return
		case <-poll.C:
		}
	}
}

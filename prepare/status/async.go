package status

import (
	"context"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Async writes claim status off the kubelet's path: ReportDevices queues the
// entries and returns at once, and a worker writes them, retrying with
// backoff until they land, the claim is gone, or the agent stops. The
// status is for people and controllers to read; the pod's start never waits
// for it. A newer report of a claim replaces a queued older one: the queue
// (client-go's workqueue) holds claim UIDs, and the latest report of each
// waits beside it.
type Async struct {
	w        Writer
	queue    workqueue.TypedRateLimitingInterface[types.UID]
	maxTries int
	mu       sync.Mutex
	latest   map[types.UID]report
}

type report struct {
	driver  string
	claim   *resourceapi.ResourceClaim
	entries []resourceapi.AllocatedDeviceStatus
}

var _ Writer = (*Async)(nil)

// asyncRetries is how many times a report is retried, with backoff from
// 100ms doubling to 30s, before it is given up (about a minute in all).
const asyncRetries = 9

// NewAsync starts the worker, which stops with ctx.
func NewAsync(ctx context.Context, w Writer) *Async {
	return newAsync(ctx, w, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](100*time.Millisecond, 30*time.Second), asyncRetries)
}

func newAsync(ctx context.Context, w Writer, limiter workqueue.TypedRateLimiter[types.UID], maxTries int) *Async {
	a := &Async{w: w, maxTries: maxTries, latest: map[types.UID]report{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "claim-status"})}
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	go a.run(ctx)
	return a
}

// ReportDevices queues the report and returns nil.
func (a *Async) ReportDevices(_ context.Context, driver string, claim *resourceapi.ResourceClaim, entries []resourceapi.AllocatedDeviceStatus) error {
	if len(entries) == 0 {
		return nil
	}
	a.mu.Lock()
	a.latest[claim.UID] = report{driver: driver, claim: claim.DeepCopy(), entries: entries}
	a.mu.Unlock()
	a.queue.Add(claim.UID)
	return nil
}

// Pending is how many reports wait to be written.
func (a *Async) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.latest)
}

func (a *Async) run(ctx context.Context) {
	for a.next(ctx) {
	}
}

// next writes the latest report of one claim; false once the queue is shut
// down.
func (a *Async) next(ctx context.Context) bool {
	uid, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(uid)
	a.mu.Lock()
	r, ok := a.latest[uid]
	delete(a.latest, uid)
	a.mu.Unlock()
	if !ok {
		a.queue.Forget(uid) // written already, by an earlier turn
		return true
	}
	err := a.w.ReportDevices(ctx, r.driver, r.claim, r.entries)
	if err == nil || apierrors.IsNotFound(err) {
		a.queue.Forget(uid)
		return true
	}
	logger := klog.FromContext(ctx)
	if a.queue.NumRequeues(uid) >= a.maxTries {
		logger.Error(err, "Giving up reporting devices in the claim's status", "claim", klog.KObj(r.claim))
		a.queue.Forget(uid)
		return true
	}
	logger.V(2).Info("Reporting devices in the claim's status failed; retrying", "claim", klog.KObj(r.claim), "err", err)
	a.mu.Lock()
	if _, newer := a.latest[uid]; !newer {
		a.latest[uid] = r
	}
	a.mu.Unlock()
	a.queue.AddRateLimited(uid)
	return true
}

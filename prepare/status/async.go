package status

import (
	"context"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Async writes claim status off the kubelet's path: ReportDevices queues the
// entries and returns at once, and a worker writes them, retrying with
// backoff until they land, the claim is gone, or the agent stops. The
// status is for people and controllers to read; the pod's start never waits
// for it. A newer report of a claim replaces a queued older one.
type Async struct {
	w       Writer
	wake    chan struct{}
	mu      sync.Mutex
	pending map[types.UID]report
	// backoff bounds the retries of one report.
	backoff []time.Duration
}

type report struct {
	driver  string
	claim   *resourceapi.ResourceClaim
	entries []resourceapi.AllocatedDeviceStatus
	tries   int
}

var _ Writer = (*Async)(nil)

// NewAsync starts the worker, which stops with ctx.
func NewAsync(ctx context.Context, w Writer) *Async {
	a := &Async{w: w, wake: make(chan struct{}, 1), pending: map[types.UID]report{},
		backoff: []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second}}
	go a.run(ctx)
	return a
}

// ReportDevices queues the report and returns nil.
func (a *Async) ReportDevices(_ context.Context, driver string, claim *resourceapi.ResourceClaim, entries []resourceapi.AllocatedDeviceStatus) error {
	if len(entries) == 0 {
		return nil
	}
	a.mu.Lock()
	a.pending[claim.UID] = report{driver: driver, claim: claim.DeepCopy(), entries: entries}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

// Pending is how many reports wait to be written.
func (a *Async) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

func (a *Async) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-retry:
		}
		retry = nil
		a.mu.Lock()
		batch := a.pending
		a.pending = map[types.UID]report{}
		a.mu.Unlock()
		var next time.Duration
		for uid, r := range batch {
			err := a.w.ReportDevices(ctx, r.driver, r.claim, r.entries)
			if err == nil || apierrors.IsNotFound(err) {
				continue
			}
			if r.tries >= len(a.backoff) {
				logger.Error(err, "Giving up reporting devices in the claim's status", "claim", klog.KObj(r.claim))
				continue
			}
			logger.V(2).Info("Reporting devices in the claim's status failed; retrying", "claim", klog.KObj(r.claim), "err", err)
			wait := a.backoff[r.tries]
			r.tries++
			a.mu.Lock()
			if _, newer := a.pending[uid]; !newer {
				a.pending[uid] = r
			}
			a.mu.Unlock()
			if next == 0 || wait < next {
				next = wait
			}
		}
		if next > 0 {
			retry = time.After(next)
		}
	}
}

package status

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
)

// flaky fails the first n writes of every claim, and blocks while held.
type flaky struct {
	mu      sync.Mutex
	fails   int
	calls   map[string]int
	written map[string]int
	hold    chan struct{}
	err     error
}

func (f *flaky) ReportDevices(_ context.Context, _ string, c *resourceapi.ResourceClaim, e []resourceapi.AllocatedDeviceStatus) error {
	if f.hold != nil {
		<-f.hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[c.Name]++
	if f.err != nil {
		return f.err
	}
	if f.calls[c.Name] <= f.fails {
		return errors.New("the API server is away")
	}
	f.written[c.Name] = len(e)
	return nil
}

func entries() []resourceapi.AllocatedDeviceStatus {
	return []resourceapi.AllocatedDeviceStatus{{Driver: "carve.dev", Pool: "p", Device: "d"}}
}

func claim(name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}}
}

// The report returns at once, even while the API server does not answer,
// and the status lands after failed attempts.
func TestAsyncReturnsAtOnceAndRetriesUntilItLands(t *testing.T) {
	f := &flaky{fails: 2, calls: map[string]int{}, written: map[string]int{}, hold: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAsync(ctx, f, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, time.Millisecond), 3)
	start := time.Now()
	if err := a.ReportDevices(ctx, "carve.dev", claim("c"), entries()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the report waited %v for the API server", took)
	}
	close(f.hold)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		done := f.written["c"] == 1
		f.mu.Unlock()
		if done {
			if a.Pending() != 0 {
				t.Errorf("%d reports still pending after the write", a.Pending())
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the status never landed: %d calls", f.calls["c"])
}

// A claim that is gone is not retried.
func TestAsyncDropsAGoneClaim(t *testing.T) {
	f := &flaky{calls: map[string]int{}, written: map[string]int{},
		err: apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "c")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAsync(ctx, f, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, time.Millisecond), 1)
	_ = a.ReportDevices(ctx, "carve.dev", claim("c"), entries())
	time.Sleep(100 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls["c"] != 1 || a.Pending() != 0 {
		t.Errorf("a gone claim was written %d times, %d pending; want once, none", f.calls["c"], a.Pending())
	}
}

// A claim whose writes keep failing is given up after the retries, and
// nothing stays pending.
func TestAsyncGivesUp(t *testing.T) {
	f := &flaky{fails: 1000, calls: map[string]int{}, written: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAsync(ctx, f, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](time.Millisecond, time.Millisecond), 3)
	_ = a.ReportDevices(ctx, "carve.dev", claim("c"), entries())
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		calls := f.calls["c"]
		f.mu.Unlock()
		if calls >= 4 && a.Pending() == 0 {
			time.Sleep(50 * time.Millisecond)
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.calls["c"] != 4 {
				t.Errorf("%d writes; want the first and 3 retries", f.calls["c"])
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d writes, %d pending", f.calls["c"], a.Pending())
}

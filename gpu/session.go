package gpu

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// DefaultTimeout bounds every NVML call. A real H100 answers Init in about
// 13 ms and a whole inventory in about 37 ms; some drivers hang instead.
const DefaultTimeout = 10 * time.Second

// ErrNoNVML means the host has no NVML library: no NVIDIA driver.
var ErrNoNVML = errors.New("NVML library not found (no NVIDIA driver on this host)")

// Session is an initialised NVML whose every call is bounded in time and
// guarded against panics. A call that does not return in time leaves the
// session wedged: later calls fail at once, since NVML's lock may still be
// held by the stuck one.
type Session struct {
	lib     Library
	timeout time.Duration
	turn    chan struct{}

	mu     sync.Mutex
	wedged error
	closed bool
	// lanes are sessions over the same NVML with their own turns (Lane);
	// Close waits for their calls before NVML is shut down.
	lanes []*Session
	lane  bool
}

// Open initialises NVML within timeout (DefaultTimeout when 0). The error
// wraps ErrNoNVML where the library is absent.
func Open(ctx context.Context, lib Library, timeout time.Duration) (*Session, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	s := &Session{lib: lib, timeout: timeout, turn: make(chan struct{}, 1)}
	start := time.Now()
	err := s.Do(ctx, "init", func(l Library) error {
		switch ret := l.Init(); ret {
		case nvml.SUCCESS:
			return nil
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			return ErrNoNVML
		default:
			return nvmlError("init", ret)
		}
	})
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("NVML initialised", "duration", time.Since(start))
	return s, nil
}

// Do runs fn with the library, one call at a time, within the session's
// time bound. A panic in fn (go-nvml's mock panics on calls it has no answer
// for) is returned as an error.
func (s *Session) Do(ctx context.Context, what string, fn func(Library) error) error {
	s.mu.Lock()
	wedged, closed := s.wedged, s.closed
	s.mu.Unlock()
	if wedged != nil {
		return wedged
	}
	if closed {
		return fmt.Errorf("NVML %s: session closed", what)
	}
	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	select {
	case s.turn <- struct{}{}:
	case <-timer.C:
		return fmt.Errorf("NVML %s: waited %s for an earlier call", what, s.timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("NVML %s: panic: %v\n%s", what, r, debug.Stack())
			}
			<-s.turn
		}()
		done <- fn(s.lib)
	}()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		err := fmt.Errorf("NVML %s did not return within %s; the driver may be hung, GPUs are left out until the agent restarts", what, s.timeout)
		s.mu.Lock()
		s.wedged = err
		s.mu.Unlock()
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wedged is the error of the call that did not return in time, after which
// every call fails at once; nil while the session answers.
func (s *Session) Wedged() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wedged
}

// Inventory reads every GPU (see Read).
func (s *Session) Inventory(ctx context.Context) (*nvmlinfo.Inventory, error) {
	var inv *nvmlinfo.Inventory
	err := s.Do(ctx, "inventory", func(l Library) error {
		var err error
		inv, err = Read(l)
		return err
	})
	return inv, err
}

// Lane is a session over the same initialised NVML with a turn of its own:
// its calls never wait behind this session's. The policing loop's process
// queries go through one, since this session's turn is held for seconds at
// a time: nvcdi's walk of the driver's files inside "CDI edits", a MIG
// instance's create or destroy. NVML itself is thread-safe (NVIDIA's API
// reference: "NVML is thread-safe so it is safe to make simultaneous NVML
// calls from multiple threads"); the turn is carve's, to bound each call in
// time and tell a hung driver from a slow one. Either session's hung call
// wedges only that session. Close the parent only: it closes its lanes.
func (s *Session) Lane() *Session {
	l := &Session{lib: s.lib, timeout: s.timeout, turn: make(chan struct{}, 1), lane: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	l.closed = s.closed
	s.lanes = append(s.lanes, l)
	return l
}

// Close shuts NVML down, unless a call is stuck in it. A lane is only
// marked closed: NVML is its parent's.
func (s *Session) Close(ctx context.Context) {
	s.mu.Lock()
	skip := s.wedged != nil || s.closed
	lanes := s.lanes
	if s.lane {
		s.closed = true
	}
	s.mu.Unlock()
	if skip || s.lane {
		return
	}
	// No lane call may be in NVML while it shuts down: mark each closed,
	// then wait for its turn (a wedged lane's call never returns; its turn
	// is not waited for past the time bound).
	for _, l := range lanes {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		select {
		case l.turn <- struct{}{}:
		case <-time.After(l.timeout):
		case <-ctx.Done():
		}
	}
	if err := s.Do(ctx, "shutdown", func(l Library) error {
		if ret := l.Shutdown(); ret != nvml.SUCCESS {
			return nvmlError("shutdown", ret)
		}
		return nil
	}); err != nil {
		klog.FromContext(ctx).V(2).Info("NVML shutdown", "err", err)
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

package health

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Severity is how bad a device's condition is.
type Severity int

// Severities, in order: a worse one has a larger value.
const (
	Healthy Severity = iota
	// Degraded: the device is there and works worse (link down, errors).
	Degraded
	// Lost: the device is gone or no longer answers.
	Lost
)

func (s Severity) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// Condition is what one source says of one device.
type Condition struct {
	// Device is the published device's name.
	Device string
	// Source names the signal ("link", "errors", "xid"): a device's
	// sources are kept apart, and the device is healthy once all are.
	Source   string
	Severity Severity
	// Reason is the taint's value: a label value, such as LinkDown.
	Reason  string
	Message string
}

// Sink takes conditions.
type Sink interface {
	Observe(c Condition)
}

// Source watches devices and reports their conditions to a Sink until ctx
// is done.
type Source interface {
	Run(ctx context.Context, sink Sink) error
}

// Status is a device's health as the Tracker decided it.
type Status struct {
	Device string
	// Tainted is true from the first failure until the hold-down after
	// the last one has passed.
	Tainted bool
	// Severity, Reason and Message are the taint's: the worst condition
	// seen since it was made. Healthy and empty when not tainted.
	Severity Severity
	Reason   string
	Message  string
	// Since is when the taint was made (or its reason last changed).
	Since time.Time
	// Recovering is true while every source says healthy and the
	// hold-down runs; ClearAt is when it ends.
	Recovering bool
	ClearAt    time.Time
	// Flaps counts failures within a hold-down; HoldDown is the current
	// one, grown by flaps.
	Flaps    int
	HoldDown time.Duration
	// Changes counts the device's changes of taint (made, reason
	// changed, cleared).
	Changes int
}

// Tracker holds every device's health state.
type Tracker struct {
	holdDown, maxHoldDown time.Duration
	clock                 clock.Clock
	mu                    sync.Mutex
	devices               map[string]*device
	// changed is signalled after every change of a Status's taint.
	changed chan struct{}
	// wake makes Run look at the hold-downs again.
	wake chan struct{}
}

type device struct {
	sources map[string]Condition
	status  Status
	// lastClear is when the last taint cleared: a failure soon after is
	// a flap too.
	lastClear time.Time
}

// NewTracker returns a Tracker with the hold-down and its cap; clk nil is
// the real clock.
func NewTracker(holdDown, maxHoldDown time.Duration, clk clock.Clock) *Tracker {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if maxHoldDown < holdDown {
		maxHoldDown = holdDown
	}
	return &Tracker{holdDown: holdDown, maxHoldDown: maxHoldDown, clock: clk, devices: map[string]*device{},
		changed: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
}

// Changed receives after the taint of a device changed.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// worst is the device's worst current condition; Healthy where every
// source says so.
func (d *device) worst() Condition {
	keys := make([]string, 0, len(d.sources))
	for k := range d.sources {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	w := Condition{Severity: Healthy}
	for _, k := range keys {
		if c := d.sources[k]; c.Severity > w.Severity {
			w = c
		}
	}
	return w
}

// Observe records a source's condition of a device and moves the device's
// state on.
func (t *Tracker) Observe(c Condition) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	d := t.devices[c.Device]
	if d == nil {
		if c.Severity == Healthy {
			return // nothing to remember of a device never unhealthy
		}
		d = &device{sources: map[string]Condition{}, status: Status{Device: c.Device, HoldDown: t.holdDown}}
		t.devices[c.Device] = d
	}
	if c.Severity == Healthy {
		delete(d.sources, c.Source)
	} else {
		d.sources[c.Source] = c
	}
	w := d.worst()
	s := &d.status
	switch {
	case w.Severity == Healthy && s.Tainted && !s.Recovering:
		s.Recovering, s.ClearAt = true, now.Add(s.HoldDown)
		signal(t.wake)
		signal(t.changed) // the kubelet's message says it recovers
	case w.Severity != Healthy && !s.Tainted:
		if !d.lastClear.IsZero() && now.Sub(d.lastClear) < s.HoldDown {
			s.Flaps++
			s.HoldDown = min(2*s.HoldDown, t.maxHoldDown)
		} else {
			s.Flaps, s.HoldDown = 0, t.holdDown
		}
		s.Tainted, s.Severity, s.Reason, s.Message, s.Since = true, w.Severity, w.Reason, w.Message, now
		s.Changes++
		signal(t.changed)
	case w.Severity != Healthy:
		if s.Recovering {
			s.Recovering, s.ClearAt = false, time.Time{}
			s.Flaps++
			s.HoldDown = min(2*s.HoldDown, t.maxHoldDown)
			signal(t.changed)
		}
		if w.Severity > s.Severity {
			s.Severity, s.Reason, s.Message, s.Since = w.Severity, w.Reason, w.Message, now
			s.Changes++
			signal(t.changed)
		} else if w.Reason == s.Reason && w.Message != s.Message {
			s.Message = w.Message
		}
	}
	if !s.Tainted && len(d.sources) == 0 && (d.lastClear.IsZero() || now.Sub(d.lastClear) >= s.HoldDown) {
		delete(t.devices, c.Device)
	}
}

// Forget drops a device's state (it is no longer published at all).
func (t *Tracker) Forget(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.devices[name]; ok {
		delete(t.devices, name)
		signal(t.changed)
	}
}

// expire clears the taints whose hold-down has passed and returns when the
// next one ends (zero where none runs).
func (t *Tracker) expire() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	var next time.Time
	for name, d := range t.devices {
		s := &d.status
		if !s.Recovering {
			continue
		}
		if !now.Before(s.ClearAt) {
			d.lastClear = now
			hd, flaps, changes := s.HoldDown, s.Flaps, s.Changes+1
			d.status = Status{Device: name, HoldDown: hd, Flaps: flaps, Changes: changes}
			signal(t.changed)
			continue
		}
		if next.IsZero() || s.ClearAt.Before(next) {
			next = s.ClearAt
		}
	}
	return next
}

// Run clears the taints whose hold-down has passed, as they pass, until ctx
// is done.
func (t *Tracker) Run(ctx context.Context) {
	for {
		next := t.expire()
		var timer <-chan time.Time
		if !next.IsZero() {
			timer = t.clock.After(next.Sub(t.clock.Now()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-timer:
		}
	}
}

// Status returns a device's status; a device never unhealthy is healthy.
func (t *Tracker) Status(name string) Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d, ok := t.devices[name]; ok {
		return d.status
	}
	return Status{Device: name, HoldDown: t.holdDown}
}

// Snapshot returns the status of every device the Tracker remembers (those
// tainted, and those cleared that may still flap), by name.
func (t *Tracker) Snapshot() map[string]Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]Status, len(t.devices))
	for name, d := range t.devices {
		out[name] = d.status
	}
	return out
}

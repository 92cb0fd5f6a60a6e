package gpu

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Lanes gives each GPU a lane of its own (Session.Lane) for the calls
// that must keep going on every GPU, the policing loop's process queries:
// with one lane for all, one call hung in the driver for one GPU wedged the
// lane and stopped policing on every GPU for good, while every GPU still
// published memoryEnforcement=mps-policed. A wedged lane is tried again
// with a fresh one after Retry; until then its GPU's calls fail at once and
// Wedged reports it (a health condition of that GPU, and its new shares
// refused).
type Lanes struct {
	parent *Session
	// Retry is how long a wedged lane is left before a fresh one is
	// tried (30 s when 0). The hung call keeps its goroutine; a fresh
	// lane that hangs again costs one more, once per Retry.
	Retry time.Duration

	mu    sync.Mutex
	lanes map[string]*gpuLane
}

type gpuLane struct {
	s *Session
	// wedged is when the lane was first seen wedged; zero while it
	// answers.
	wedged time.Time
}

// GPULanes returns per-GPU lanes over s.
func (s *Session) GPULanes() *Lanes {
	return &Lanes{parent: s, lanes: map[string]*gpuLane{}}
}

// Lane is the GPU's lane: its own, made on first use, or a fresh one
// where its own has been wedged for Retry.
func (g *Lanes) Lane(uuid string) *Session {
	retry := g.Retry
	if retry <= 0 {
		retry = 30 * time.Second
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.lanes[uuid]
	if l == nil {
		l = &gpuLane{s: g.parent.Lane()}
		g.lanes[uuid] = l
	}
	if l.s.Wedged() != nil {
		now := time.Now()
		switch {
		case l.wedged.IsZero():
			l.wedged = now
		case now.Sub(l.wedged) >= retry:
			l.s, l.wedged = g.parent.Lane(), time.Time{}
		}
	}
	return l.s
}

// Wedged says why the GPU's lane is wedged, or nil where it answers.
func (g *Lanes) Wedged(uuid string) error {
	g.mu.Lock()
	l := g.lanes[uuid]
	g.mu.Unlock()
	if l == nil {
		return nil
	}
	if err := l.s.Wedged(); err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	return nil
}

// Processes lists the GPU's processes through its own lane (see
// Session.Processes).
func (g *Lanes) Processes(ctx context.Context, uuid string) ([]Process, error) {
	return g.Lane(uuid).Processes(ctx, uuid)
}

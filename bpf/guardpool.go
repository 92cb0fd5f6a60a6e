package bpf

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
)

// Loading a share's pod guard (its program, data map and BTF) was the
// largest single step of a steady NIC prepare: 1.2 ms of the agent's 3.7
// (issue 44, BenchmarkPrepare1 against the local cluster). The guard's
// program is the same for every share; only its data differ. So the agent
// loads guards ahead, into a pool, once no prepare has asked for one for a
// while, and a prepare takes one, writes its share's data, freezes them
// and pins it. A burst that drains the pool loads the rest on demand, as
// without a pool, and the pool fills again when the burst is over: the
// filler stops at a burst's next prepare. A serial stream of prepares a few
// milliseconds apart still shares the CPU with it (BenchmarkPrepare1 read
// no gain end to end on two vCPUs); a node's pods arriving seconds apart
// find their guard loaded. A pooled guard is only
// held by this process's descriptors, so a crash leaves nothing behind.

// guardDataSection is the pod guard's data map (shaper.c).
const guardDataSection = ".data.pod_guard"

// loadedGuard is a pod guard loaded with no share's data yet.
type loadedGuard struct {
	prog *ebpf.Program
	data *ebpf.Map
}

func (g loadedGuard) close() {
	g.prog.Close()
	g.data.Close()
}

// guardPool holds guards loaded ahead of the prepares that take them.
type guardPool struct {
	ready chan loadedGuard
	// asked wakes the filler: a prepare took a guard, or found none.
	asked chan struct{}
	// quiet is how long no prepare must have asked before the filler
	// loads.
	quiet time.Duration
	stop  chan struct{}
	done  sync.WaitGroup
}

// PreloadPodGuards keeps up to size pod guards loaded ahead for
// PinPodGuard, loading them once no prepare has asked for one for quiet.
// The first fill starts after quiet too. Close stops it and releases the
// guards not taken. Without it, each PinPodGuard loads its guard.
func (s *Shaper) PreloadPodGuards(size int, quiet time.Duration) error {
	if size <= 0 {
		return fmt.Errorf("pod guard pool of %d", size)
	}
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	if s.pool != nil {
		return errors.New("the pod guards are preloaded already")
	}
	p := &guardPool{ready: make(chan loadedGuard, size), asked: make(chan struct{}, 1), quiet: quiet, stop: make(chan struct{})}
	s.pool = p
	p.done.Add(1)
	go s.fillGuards(p)
	return nil
}

// fillGuards loads guards into p until it is full, each time quiet has
// passed with no prepare asking, and stops between two loads when one asks.
func (s *Shaper) fillGuards(p *guardPool) {
	defer p.done.Done()
	timer := time.NewTimer(p.quiet)
	defer timer.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.asked:
			timer.Reset(p.quiet)
			continue
		case <-timer.C:
		}
	fill:
		for len(p.ready) < cap(p.ready) {
			select {
			case <-p.stop:
				return
			case <-p.asked: // a burst: it loads on demand; fill after it
				timer.Reset(p.quiet)
				break fill
			default:
			}
			g, err := s.loadGuard()
			if err != nil {
				// Prepares load their own and report what fails;
				// tried again after the next quiet.
				timer.Reset(p.quiet)
				break fill
			}
			p.ready <- g // never blocks: only this goroutine adds
		}
	}
}

// takeGuard is a guard from the pool, or one loaded now where the pool is
// empty or off.
func (s *Shaper) takeGuard() (loadedGuard, error) {
	s.poolMu.Lock()
	p := s.pool
	s.poolMu.Unlock()
	if p != nil {
		select {
		case p.asked <- struct{}{}:
		default: // woken already
		}
		select {
		case g := <-p.ready:
			return g, nil
		default:
		}
	}
	return s.loadGuard()
}

// loadGuard loads a pod guard whose data are zero: no share's.
func (s *Shaper) loadGuard() (loadedGuard, error) {
	spec := s.guardSpec.Copy() // its maps the classifier's own, pinned by name
	var objs struct {
		Guard *ebpf.Program `ebpf:"pod_guard"`
		Data  *ebpf.Map     `ebpf:".data.pod_guard"`
	}
	// The policy's program array is this classifier's own, open already:
	// no pin to open and check at every load.
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: s.pinDir}, MapReplacements: map[string]*ebpf.Map{"pod_guard_policy": s.objs.PodGuardPolicy}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return loadedGuard{}, fmt.Errorf("load a pod guard: %w", err)
	}
	return loadedGuard{prog: objs.Guard, data: objs.Data}, nil
}

// closePool stops the filler and releases the guards not taken.
func (s *Shaper) closePool() {
	s.poolMu.Lock()
	p := s.pool
	s.pool = nil
	s.poolMu.Unlock()
	if p == nil {
		return
	}
	close(p.stop)
	p.done.Wait()
	for {
		select {
		case g := <-p.ready:
			g.close()
		default:
			return
		}
	}
}

// guardData is the guard's data map's value with the share's values: the
// section's variables at their offsets, as the object lays them out.
func (s *Shaper) guardData(values map[string]any) ([]byte, error) {
	ms, ok := s.guardSpec.Maps[guardDataSection]
	if !ok {
		return nil, fmt.Errorf("pod guard: no map %s in the classifier", guardDataSection)
	}
	buf := make([]byte, ms.ValueSize)
	for name, v := range values {
		vs, ok := s.guardSpec.Variables[name]
		if !ok || vs.SectionName != guardDataSection {
			return nil, fmt.Errorf("pod guard: no variable %s in %s", name, guardDataSection)
		}
		vs = vs.Copy()
		if err := vs.Set(v); err != nil {
			return nil, fmt.Errorf("pod guard: set %s: %w", name, err)
		}
		if int(vs.Offset)+len(vs.Value) > len(buf) {
			return nil, fmt.Errorf("pod guard: %s at %d+%d is past its section's %d bytes", name, vs.Offset, len(vs.Value), len(buf))
		}
		copy(buf[vs.Offset:], vs.Value)
	}
	return buf, nil
}

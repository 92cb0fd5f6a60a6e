package nettest

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Slot is what one set of flows delivered in one of its turns.
type Slot struct {
	Bytes    int64
	Duration time.Duration
}

// Rate is in bits per second.
func (s Slot) Rate() float64 { return float64(s.Bytes) * 8 / s.Duration.Seconds() }

// RunAlternating compares sets of TCP flows under the same conditions: all
// connections stay open, and the sets take turns of slot each to send,
// rounds times, the order changing every round (0 1, 1 0, 0 1...). Other
// work on the machine then weighs on every set alike, which two runs one
// after the other cannot promise. warmup (every set sending in turn) is not
// counted. It returns, by set, what each of its turns delivered.
func RunAlternating(sets [][]Flow, warmup, slot time.Duration, rounds int) ([][]Slot, error) {
	type running struct {
		counted []*atomic.Int64
		gate    *gate
	}
	runs := make([]running, len(sets))
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	for i, flows := range sets {
		runs[i].gate = newGate()
		defer runs[i].gate.finish()
		for _, f := range flows {
			l, err := Listen(f.To, f.ToAddr)
			if err != nil {
				return nil, err
			}
			closers = append(closers, l.Close)
			n := &atomic.Int64{}
			runs[i].counted = append(runs[i].counted, n)
			go drain(l, n)
			c, err := Dial(f.From, f.ToAddr)
			if err != nil {
				return nil, err
			}
			closers = append(closers, c.Close)
			go runs[i].gate.send(c)
		}
	}
	total := func(i int) int64 {
		var sum int64
		for _, n := range runs[i].counted {
			sum += n.Load()
		}
		return sum
	}
	turn := func(i int, d time.Duration) Slot {
		runs[i].gate.set(true)
		start, t0 := total(i), time.Now()
		time.Sleep(d)
		runs[i].gate.set(false)
		return Slot{Bytes: total(i) - start, Duration: time.Since(t0)}
	}
	for i := range sets {
		turn(i, warmup/time.Duration(len(sets)))
	}
	out := make([][]Slot, len(sets))
	for r := range rounds {
		for k := range sets {
			i := k
			if r%2 == 1 {
				i = len(sets) - 1 - k
			}
			out[i] = append(out[i], turn(i, slot))
		}
	}
	return out, nil
}

// drain accepts one connection on l and counts what it reads.
func drain(l net.Listener, n *atomic.Int64) {
	c, err := l.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	for {
		k, err := c.Read(buf)
		n.Add(int64(k))
		if err != nil {
			return
		}
	}
}

// gate lets a set's senders write while it is open.
type gate struct {
	mu   sync.Mutex
	cond *sync.Cond
	open bool
	done bool
}

func newGate() *gate {
	g := &gate{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gate) set(open bool) {
	g.mu.Lock()
	g.open = open
	g.mu.Unlock()
	g.cond.Broadcast()
}

func (g *gate) finish() {
	g.mu.Lock()
	g.done = true
	g.mu.Unlock()
	g.cond.Broadcast()
}

// send writes to c while the gate is open, in 64 KiB writes, so that a
// write under way when it closes adds little to the set's turn.
func (g *gate) send(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		g.mu.Lock()
		for !g.open && !g.done {
			g.cond.Wait()
		}
		done := g.done
		g.mu.Unlock()
		if done {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

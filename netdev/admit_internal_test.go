package netdev

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The gate lets prepareWidth prepares in at once and no more, every one in
// the end, and a waiter whose caller gave up leaves the queue with its
// context's error. (The order of the waiters is semaphore.Weighted's: first
// come, first served.)
func TestPrepareGateBoundsPrepares(t *testing.T) {
	g := newPrepareGate()
	ctx := context.Background()
	var in, most, done atomic.Int32
	var wg sync.WaitGroup
	const prepares = 5 * prepareWidth
	for range prepares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leave, err := g.enter(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			n := in.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			in.Add(-1)
			done.Add(1)
			leave()
		}()
	}
	wg.Wait()
	if most.Load() > prepareWidth {
		t.Fatalf("%d prepares in at once, want at most %d", most.Load(), prepareWidth)
	}
	if done.Load() != prepares {
		t.Fatalf("%d of %d prepares admitted", done.Load(), prepares)
	}

	var held []func()
	for range prepareWidth {
		leave, err := g.enter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, leave)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := g.enter(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a prepare past the width whose caller gave up: %v, want the context's error", err)
	}
	for _, leave := range held {
		leave()
	}
	// What the one that gave up did not take is free again.
	leave, err := g.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leave()
}

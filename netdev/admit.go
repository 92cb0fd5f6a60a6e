package netdev

import (
	"context"
	"fmt"

	"golang.org/x/sync/semaphore"
)

// A burst of share pods (a Deployment scaled up, a node drained onto this
// one) sends the agent as many prepares at once, and each makes some forty
// requests that take the kernel's RTNL: its interface, its classes, their
// leaves. Run all at once they share that lock, every prepare advancing a
// request at a time, so all of them finish near the end of the burst: with
// 250 share pods on the real node carve's prepare averaged 10-14 s, and 38
// took past the kubelet's 45 s and were sent again. The pods' sandboxes
// (CNI: more RTNL) and the runtime hook then all waited for the same
// moment. Admitted a few at a time, in arrival order, prepares finish one
// after another across the burst: the first pods go on to their sandboxes
// and containers while later ones prepare, and the mean wait is about half
// the burst's work rather than all of it.
//
// prepareWidth is how many NIC prepares run at once: more than one, so
// that one's RTNL requests overlap another's work off that lock (its pod
// guard's load, its address record's write to the API server, its files).

const prepareWidth = 4

// prepareGate admits NIC prepares, prepareWidth at a time, first come
// first served (semaphore.Weighted serves its waiters in order).
type prepareGate struct{ sem *semaphore.Weighted }

func newPrepareGate() prepareGate { return prepareGate{sem: semaphore.NewWeighted(prepareWidth)} }

// enter waits for the prepare's turn; the returned func lets the next one
// in. A prepare whose caller gave up (the kubelet's deadline) leaves the
// queue with the context's error.
func (g prepareGate) enter(ctx context.Context) (leave func(), err error) {
	if err := g.sem.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("waiting for the node's other NIC prepares (%d at a time): %w", prepareWidth, err)
	}
	return func() { g.sem.Release(1) }, nil
}

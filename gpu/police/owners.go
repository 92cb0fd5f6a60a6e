package police

import (
	"context"
	"time"
)

// The API server is asked which pods hold a claim here, beside the loop and
// never in a tick: a slow or unreachable API server must not delay a kill.
// A tick that sees a pod it cannot place only wakes this loop; the pod is
// placed (and, if over, killed) on the first tick after the answer. Pods are
// reserved before their containers start, so the ask on Add usually answers
// before the pod's first process appears.

// wantOwners wakes the owners loop without waiting.
func (p *Police) wantOwners() {
	select {
	case p.ownersDue <- struct{}{}:
	default:
	}
}

// runOwners asks for the claims' pods whenever woken, until ctx ends.
func (p *Police) runOwners(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.ownersDue:
			p.RefreshOwners(ctx)
		}
	}
}

// RefreshOwners asks again, at most once a second per share, which pods
// each share's claim is reserved for.
func (p *Police) RefreshOwners(ctx context.Context) {
	if p.opts.Owners == nil {
		return
	}
	p.mu.Lock()
	var due []*state
	now := time.Now()
	for _, st := range p.shares {
		if now.Sub(st.asked) >= ownersEvery {
			st.asked = now
			due = append(due, st)
		}
	}
	p.mu.Unlock()
	for _, st := range due {
		pods, err := p.opts.Owners.ReservedPods(ctx, st.Namespace, st.Name)
		if err != nil {
			p.logger(ctx).Error(err, "Reading the pods of a GPU share's claim", "claim", st.Namespace+"/"+st.Name)
			continue
		}
		p.mu.Lock()
		st.pods = pods
		p.mu.Unlock()
	}
}

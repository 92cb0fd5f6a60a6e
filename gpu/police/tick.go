package police

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
)

// proc is one process of a pool as a tick saw it.
type proc struct {
	pid   int
	pod   types.UID
	used  uint64
	start uint64
}

// pool is what one limit holds on a GPU: shares joined by the pods that
// hold them. A pod holding two shares of a GPU may use their slices'
// sum there; a share held by two pods is one slice for both. Shares that
// share a pod are pooled transitively (pod A with s1 and s2, pod B with s2:
// one pool of s1+s2 for A and B), the tightest limit that never kills a
// pod within what its claims were given.
type pool struct {
	shares  []*state // by key
	pods    map[types.UID]PodRef
	limit   uint64
	procs   []proc
	unknown int
}

// lookWait is how long a tick waits for a GPU's look: a look is an NVML
// process query (about 0.6 ms) and /proc reads. One that takes longer is
// left to finish by itself, and its GPU is passed by until it has.
const lookWait = time.Second

// Tick looks once at every GPU with shares and kills what exceeds a limit.
// It reads NVML and /proc only: no API server, no lock a prepare holds.
// Each GPU is looked at on its own, at once: a query hung in the driver for
// one GPU (up to the session's time bound, then its lane is wedged) holds
// that GPU's look alone, and the others are policed meanwhile.
func (p *Police) Tick(ctx context.Context) error {
	byGPU := map[string][]*state{}
	p.mu.Lock()
	for _, st := range p.shares {
		byGPU[st.UUID] = append(byGPU[st.UUID], st)
	}
	p.mu.Unlock()
	var errs []error
	done := make(chan error, len(byGPU))
	started := 0
	for uuid, shares := range byGPU {
		p.mu.Lock()
		passed, busy := p.looking[uuid]
		if busy {
			p.looking[uuid] = passed + 1
		} else {
			p.looking[uuid] = 0
		}
		p.mu.Unlock()
		if busy {
			if passed == 0 {
				errs = append(errs, fmt.Errorf("GPU %s: its last look has not returned (NVML may be hung there); its shares wait, the other GPUs are policed", uuid))
			}
			continue
		}
		started++
		go func() {
			err := p.tickGPU(ctx, uuid, shares)
			p.mu.Lock()
			delete(p.looking, uuid)
			if err == nil {
				delete(p.failing, uuid)
			} else if p.failing[uuid] == err.Error() {
				err = nil // reported already
			} else {
				p.failing[uuid] = err.Error()
			}
			p.mu.Unlock()
			done <- err
		}()
	}
	wait := time.NewTimer(lookWait)
	defer wait.Stop()
collect:
	for ; started > 0; started-- {
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, err)
			}
		case <-wait.C:
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	if err := p.persist(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *Police) tickGPU(ctx context.Context, uuid string, shares []*state) error {
	list, err := p.opts.Processes.Processes(ctx, uuid)
	if err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	pools, byPod := p.pools(shares)
	stranger := false
	for _, pr := range list {
		pod, err := PodOf(p.opts.ProcRoot, int(pr.PID))
		if err != nil {
			continue // gone, or not a pod's (the MPS server, the node's)
		}
		pl := byPod[pod]
		if pl == nil {
			stranger = true
			continue
		}
		if pr.UsedUnknown || pr.UsedBytes == gpu.NotAvailable {
			// Not a number: counted as a process, never as bytes.
			pl.unknown++
			continue
		}
		start, err := startTime(p.opts.ProcRoot, int(pr.PID))
		if err != nil {
			continue // gone since NVML listed it: its memory goes with it
		}
		pl.procs = append(pl.procs, proc{pid: int(pr.PID), pod: pod, used: pr.UsedBytes, start: start})
	}
	if stranger {
		p.wantOwners()
	}
	for _, pl := range pools {
		p.enforce(ctx, pl)
	}
	return nil
}

// pools joins a GPU's shares by the pods they hold (union-find over the
// shares), and indexes the pools by pod.
func (p *Police) pools(shares []*state) ([]*pool, map[types.UID]*pool) {
	sort.Slice(shares, func(i, j int) bool { return shares[i].Key < shares[j].Key })
	parent := make([]int, len(shares))
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	first := map[types.UID]int{}
	refs := map[types.UID]PodRef{}
	p.mu.Lock()
	for i, st := range shares {
		for _, r := range st.pods {
			refs[r.UID] = r
			if j, ok := first[r.UID]; ok {
				parent[find(i)] = find(j)
			} else {
				first[r.UID] = i
			}
		}
	}
	p.mu.Unlock()
	byRoot := map[int]*pool{}
	var out []*pool
	for i, st := range shares {
		r := find(i)
		pl := byRoot[r]
		if pl == nil {
			pl = &pool{pods: map[types.UID]PodRef{}}
			byRoot[r] = pl
			out = append(out, pl)
		}
		pl.shares = append(pl.shares, st)
		if pl.limit > math.MaxUint64-st.Slice {
			pl.limit = math.MaxUint64
		} else {
			pl.limit += st.Slice
		}
	}
	byPod := map[types.UID]*pool{}
	for uid, i := range first {
		pl := byRoot[find(i)]
		pl.pods[uid] = refs[uid]
		byPod[uid] = pl
	}
	return out, byPod
}

// enforce kills the pool's newest processes until what is left fits.
func (p *Police) enforce(ctx context.Context, pl *pool) {
	var total uint64
	for _, pr := range pl.procs {
		total += pr.used
	}
	procs := pl.procs
	sort.Slice(procs, func(i, j int) bool {
		if procs[i].start != procs[j].start {
			return procs[i].start > procs[j].start
		}
		return procs[i].pid > procs[j].pid
	})
	for _, pr := range procs {
		if total <= pl.limit {
			break
		}
		st := pl.shareOf(pr.pod)
		err := p.opts.Kill(Target{PID: pr.pid, Pod: pr.pod, Start: pr.start})
		switch {
		case errors.Is(err, syscall.ESRCH) || errors.Is(err, ErrNotSame):
			// The process NVML listed has ended (its PID may name another
			// process now, which is left alone): its memory goes with it.
			p.logger(ctx).V(2).Info("Process over its GPU memory slice already gone", "pid", pr.pid, "share", st.ShareID, "reason", err)
			total -= pr.used
			continue
		case err != nil:
			p.logger(ctx).Error(err, "Killing a process over its GPU share", "pid", pr.pid, "claim", st.Namespace+"/"+st.Name, "share", st.ShareID)
			continue
		}
		held := total
		total -= pr.used
		p.mu.Lock()
		st.kills++
		p.mu.Unlock()
		p.metrics.kills.WithLabelValues(string(st.ClaimUID), st.ShareID).Inc()
		p.report(ctx, st, pl, pr, held)
	}
	p.mu.Lock()
	for _, st := range pl.shares {
		st.used, st.limit, st.procs, st.unknown = total, pl.limit, len(procs)+pl.unknown, pl.unknown
	}
	p.mu.Unlock()
	for _, st := range pl.shares {
		p.metrics.used.WithLabelValues(string(st.ClaimUID), st.ShareID).Set(float64(total))
		p.metrics.slice.WithLabelValues(string(st.ClaimUID), st.ShareID).Set(float64(st.Slice))
	}
}

// shareOf is the share a pod's kill is counted on: the first, by key, of
// the pool's shares the pod holds.
func (pl *pool) shareOf(pod types.UID) *state {
	for _, st := range pl.shares {
		for _, r := range st.pods {
			if r.UID == pod {
				return st
			}
		}
	}
	return pl.shares[0]
}

// report logs a kill and records it on the pod, at most once per share per
// ReportEvery; the kills in between are counted and named in the next
// report.
func (p *Police) report(ctx context.Context, st *state, pl *pool, pr proc, held uint64) {
	now := time.Now()
	p.mu.Lock()
	if !st.reported.IsZero() && now.Sub(st.reported) < p.opts.ReportEvery {
		st.suppressed++
		p.mu.Unlock()
		p.metrics.suppressed.WithLabelValues(string(st.ClaimUID), st.ShareID).Inc()
		return
	}
	suppressed := st.suppressed
	st.reported, st.suppressed = now, 0
	p.mu.Unlock()
	ref := pl.pods[pr.pod]
	if ref.UID == "" {
		ref = PodRef{Namespace: st.Namespace, UID: pr.pod}
	}
	p.logger(ctx).Info("Killed a process over its GPU memory slice", "pid", pr.pid, "pod", ref.Namespace+"/"+ref.Name,
		"claim", st.Namespace+"/"+st.Name, "share", st.ShareID, "gpu", st.UUID, "usedBytes", held, "limitBytes", pl.limit,
		"sliceBytes", st.Slice, "killsNotLogged", suppressed)
	if p.opts.Recorder == nil || ref.Name == "" {
		return
	}
	msg := fmt.Sprintf("process %d killed: share %s of GPU %s held %d MiB with it, over its %d MiB slice", pr.pid, st.ShareID, st.UUID, held>>20, pl.limit>>20)
	if len(pl.shares) > 1 {
		msg += fmt.Sprintf(" (the sum of %d shares the pod's claims hold on the GPU)", len(pl.shares))
	}
	if suppressed > 0 {
		msg += fmt.Sprintf("; %d more kills of this share since the last event", suppressed)
	}
	p.opts.Recorder.PodEvent(ref, "GPUMemorySliceExceeded", msg)
}

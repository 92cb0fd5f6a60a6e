// Package police holds each MPS share of a GPU to its memory slice for the
// whole pod: a loop reads NVML's per-process memory, maps each PID to its
// pod through /proc/<pid>/cgroup and to its share through the claim's
// reserved pods, and when a share's total exceeds its slice kills that
// share's newest processes until it fits, records an event on the pod and
// counts the kill.
//
// The bound: a share is over its slice for at most one interval (50 ms by
// default) plus one NVML query per GPU (about 0.6 ms) plus the time the
// driver takes to free a killed process's memory; in that window it can hold
// up to its processes times the GPU's MPS ceiling (the largest slice on the
// GPU), since each process is held to the ceiling by MPS itself.
package police

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
)

// DefaultInterval is how often the loop looks; with an NVML query of about
// 0.6 ms per GPU it keeps a kill within 200 ms of the excess.
const DefaultInterval = 50 * time.Millisecond

// Share is one memory slice of a GPU.
type Share struct {
	// Key is the allocation's ShareKey.
	Key       string
	ClaimUID  types.UID
	Namespace string
	Name      string
	ShareID   string
	UUID      string
	Slice     uint64
}

// PodRef names a pod that holds a claim.
type PodRef struct {
	Namespace, Name string
	UID             types.UID
}

// Processes lists the processes on a GPU with their memory (NVML).
type Processes interface {
	Processes(ctx context.Context, uuid string) ([]gpu.Process, error)
}

// Owners gives the pods a claim is reserved for (its status.reservedFor).
type Owners interface {
	ReservedPods(ctx context.Context, namespace, name string) ([]PodRef, error)
}

// Recorder records an event on a pod.
type Recorder interface {
	PodEvent(pod PodRef, reason, message string)
}

// Options are what the loop reads and acts through.
type Options struct {
	Processes Processes
	Owners    Owners
	// Recorder may be nil: kills are then only logged and counted.
	Recorder Recorder
	// ProcRoot is the host's /proc, where PIDs are mapped to pods.
	ProcRoot string
	Interval time.Duration
	// Kill ends a process; SIGKILL when nil.
	Kill func(pid int) error
	// StateFile keeps usage and kill counts for `carve shares`; none when
	// empty.
	StateFile string
	Logger    logr.Logger
}

// Police is the policing loop of every MPS share on the node.
type Police struct {
	opts    Options
	metrics *metrics

	mu      sync.Mutex
	shares  map[string]*state
	written Usage
}

type state struct {
	Share
	pods  []PodRef
	asked time.Time
	used  uint64
	kills uint64
	procs int
}

// New returns the loop; kill counts are read back from the state file.
func New(opts Options) *Police {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.Kill == nil {
		opts.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	p := &Police{opts: opts, metrics: newMetrics(), shares: map[string]*state{}}
	return p
}

// Add polices a share (again, after a restart: its kill count comes back
// from the state file).
func (p *Police) Add(s Share) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.shares[s.Key]; ok {
		old.Share = s
		return
	}
	st := &state{Share: s}
	if prev, err := ReadUsage(p.opts.StateFile); err == nil {
		if u, ok := prev[s.Key]; ok {
			st.kills = u.Kills
			p.metrics.kills.WithLabelValues(string(s.ClaimUID), s.ShareID).Add(float64(u.Kills))
		}
	}
	p.shares[s.Key] = st
}

// Remove stops policing a share.
func (p *Police) Remove(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.shares[key]; ok {
		p.metrics.forget(string(st.ClaimUID), st.ShareID)
		delete(p.shares, key)
	}
}

// Run polices until ctx ends.
func (p *Police) Run(ctx context.Context) {
	t := time.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		if err := p.Tick(ctx); err != nil && ctx.Err() == nil {
			p.opts.Logger.Error(err, "Policing GPU shares")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type proc struct {
	pid   int
	pod   types.UID
	used  uint64
	start uint64
}

// Tick looks once at every GPU with shares and kills what exceeds a slice.
func (p *Police) Tick(ctx context.Context) error {
	byGPU := map[string][]*state{}
	p.mu.Lock()
	for _, st := range p.shares {
		byGPU[st.UUID] = append(byGPU[st.UUID], st)
	}
	p.mu.Unlock()
	var errs []error
	for uuid, shares := range byGPU {
		if err := p.tickGPU(ctx, uuid, shares); err != nil {
			errs = append(errs, err)
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
	held := map[*state][]proc{}
	refreshed := false
	for _, pr := range list {
		pod, err := PodOf(p.opts.ProcRoot, int(pr.PID))
		if err != nil {
			continue // gone, or not a pod's (the MPS server, the node's)
		}
		st := p.shareOf(shares, pod)
		if st == nil && !refreshed {
			p.refreshOwners(ctx, shares)
			refreshed = true
			st = p.shareOf(shares, pod)
		}
		if st == nil {
			continue
		}
		held[st] = append(held[st], proc{pid: int(pr.PID), pod: pod, used: pr.UsedBytes, start: StartTime(p.opts.ProcRoot, int(pr.PID))})
	}
	for _, st := range shares {
		p.enforce(st, held[st])
	}
	return nil
}

// enforce kills the share's newest processes until what is left fits.
func (p *Police) enforce(st *state, procs []proc) {
	var total uint64
	for _, pr := range procs {
		total += pr.used
	}
	sort.Slice(procs, func(i, j int) bool {
		if procs[i].start != procs[j].start {
			return procs[i].start > procs[j].start
		}
		return procs[i].pid > procs[j].pid
	})
	for _, pr := range procs {
		if total <= st.Slice {
			break
		}
		err := p.opts.Kill(pr.pid)
		if err != nil && !errors.Is(err, syscall.ESRCH) {
			p.opts.Logger.Error(err, "Killing a process over its GPU share", "pid", pr.pid, "claim", st.Namespace+"/"+st.Name, "share", st.ShareID)
			continue
		}
		total -= pr.used
		pod := pr.pod
		msg := fmt.Sprintf("process %d killed: share %s of GPU %s held %d MiB with it, over its %d MiB slice", pr.pid, st.ShareID, st.UUID, (total+pr.used)>>20, st.Slice>>20)
		p.opts.Logger.Info("Killed a process over its GPU memory slice", "pid", pr.pid, "claim", st.Namespace+"/"+st.Name, "share", st.ShareID, "gpu", st.UUID, "usedBytes", total+pr.used, "sliceBytes", st.Slice)
		p.mu.Lock()
		st.kills++
		ref := PodRef{Namespace: st.Namespace, UID: pod}
		for _, r := range st.pods {
			if r.UID == pod {
				ref = r
			}
		}
		p.mu.Unlock()
		p.metrics.kills.WithLabelValues(string(st.ClaimUID), st.ShareID).Inc()
		if p.opts.Recorder != nil && ref.Name != "" {
			p.opts.Recorder.PodEvent(ref, "GPUMemorySliceExceeded", msg)
		}
	}
	p.mu.Lock()
	st.used, st.procs = total, len(procs)
	p.mu.Unlock()
	p.metrics.used.WithLabelValues(string(st.ClaimUID), st.ShareID).Set(float64(total))
}

func (p *Police) shareOf(shares []*state, pod types.UID) *state {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range shares {
		for _, r := range st.pods {
			if r.UID == pod {
				return st
			}
		}
	}
	return nil
}

// refreshOwners asks again, at most once a second per share, which pods
// each share's claim is reserved for.
func (p *Police) refreshOwners(ctx context.Context, shares []*state) {
	for _, st := range shares {
		p.mu.Lock()
		due := time.Since(st.asked) >= time.Second
		if due {
			st.asked = time.Now()
		}
		p.mu.Unlock()
		if !due || p.opts.Owners == nil {
			continue
		}
		pods, err := p.opts.Owners.ReservedPods(ctx, st.Namespace, st.Name)
		if err != nil {
			p.opts.Logger.Error(err, "Reading the pods of a GPU share's claim", "claim", st.Namespace+"/"+st.Name)
			continue
		}
		p.mu.Lock()
		st.pods = pods
		p.mu.Unlock()
	}
}

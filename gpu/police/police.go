package police

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/gpu"
)

// DefaultInterval is how often the loop looks; with an NVML query of about
// 0.6 ms per GPU it keeps a kill within 200 ms of the excess.
const DefaultInterval = 50 * time.Millisecond

// DefaultReportEvery is how often a share's kills are logged and recorded
// as pod events at most: a pod that respawns its over-limit process is
// killed every tick, and a log line and event per kill would flood both.
// Every kill is still counted (carve_gpu_share_kills_total).
const DefaultReportEvery = 10 * time.Second

// ownersEvery is how often one share's claim is asked for its pods at most.
const ownersEvery = time.Second

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
	// Processes should not wait on other NVML work: give the loop a
	// gpu.Session's Lane, not the session the preparer uses.
	Processes Processes
	Owners    Owners
	// Recorder may be nil: kills are then only logged and counted.
	Recorder Recorder
	// ProcRoot is the host's /proc, where PIDs are mapped to pods.
	ProcRoot string
	Interval time.Duration
	// Kill ends a process; KillChecked below ProcRoot when nil.
	Kill func(Target) error
	// StateFile keeps usage and kill counts for `carve shares`; none when
	// empty.
	StateFile string
	// ReportEvery is DefaultReportEvery when 0.
	ReportEvery time.Duration
	// Logger is the context's logger when unset.
	Logger logr.Logger
}

// Police is the policing loop of every MPS share on the node.
type Police struct {
	opts    Options
	metrics *metrics
	// ownersDue wakes the owners loop: a share was added, or a tick saw a
	// pod on a GPU that none of the GPU's shares is known to hold.
	ownersDue chan struct{}

	mu      sync.Mutex
	shares  map[string]*state
	written Usage
	// looking are the GPUs whose look has not returned yet, with the
	// ticks that have passed them by since.
	looking map[string]int
	// failing is each GPU's last look's error, reported once until it
	// changes or a look succeeds (a wedged lane fails every 50 ms).
	failing map[string]string
}

type state struct {
	Share
	pods  []PodRef
	asked time.Time
	// What the last tick saw of the pool the share is held in (the share
	// alone, unless its pods hold other shares of the GPU).
	used    uint64
	limit   uint64
	procs   int
	unknown int
	kills   uint64
	// Reports: the last kill logged, and the kills since not logged.
	reported   time.Time
	suppressed uint64
}

// New returns the loop; kill counts are read back from the state file.
func New(opts Options) *Police {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.ReportEvery <= 0 {
		opts.ReportEvery = DefaultReportEvery
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.Kill == nil {
		root := opts.ProcRoot
		opts.Kill = func(t Target) error { return KillChecked(root, t) }
	}
	return &Police{opts: opts, metrics: newMetrics(), shares: map[string]*state{}, looking: map[string]int{}, failing: map[string]string{}, ownersDue: make(chan struct{}, 1)}
}

// Add polices a share (again, after a restart: its kill count comes back
// from the state file). Its claim's pods are asked for beside the loop.
func (p *Police) Add(s Share) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.wantOwners()
	if old, ok := p.shares[s.Key]; ok {
		old.Share = s
		return
	}
	st := &state{Share: s, limit: s.Slice}
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

// Shares lists the shares policed now, by key.
func (p *Police) Shares() map[string]Share {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Share, len(p.shares))
	for k, st := range p.shares {
		out[k] = st.Share
	}
	return out
}

// Run polices until ctx ends, with the owners loop beside it.
func (p *Police) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.runOwners(ctx) }()
	defer wg.Wait()
	t := time.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		if err := p.Tick(ctx); err != nil && ctx.Err() == nil {
			p.logger(ctx).Error(err, "Policing GPU shares")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Police) logger(ctx context.Context) logr.Logger {
	if p.opts.Logger.GetSink() != nil {
		return p.opts.Logger
	}
	return klog.FromContext(ctx)
}

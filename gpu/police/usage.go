package police

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// ShareUsage is what the loop last saw of a share.
type ShareUsage struct {
	UsedBytes uint64 `json:"usedBytes"`
	Processes int    `json:"processes"`
	Kills     uint64 `json:"kills"`
	// Pods are the pods the share's claim is reserved for.
	Pods []types.UID `json:"pods,omitempty"`
	// LimitBytes is what UsedBytes is held to where the share's pods hold
	// other shares of the GPU too (the sum of their slices; UsedBytes is
	// then theirs together); absent where it is the share's own slice.
	LimitBytes uint64 `json:"limitBytes,omitempty"`
	// UnknownProcesses are processes NVML gave no memory reading for
	// ("not available"), counted in Processes but not in UsedBytes.
	UnknownProcesses int `json:"unknownProcesses,omitempty"`
}

// Usage is every share's, by share key.
type Usage map[string]ShareUsage

// Usage reports every policed share's usage now.
func (p *Police) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := Usage{}
	for k, st := range p.shares {
		u := ShareUsage{UsedBytes: st.used, Processes: st.procs, Kills: st.kills, UnknownProcesses: st.unknown}
		if st.limit != st.Slice {
			u.LimitBytes = st.limit
		}
		for _, r := range st.pods {
			u.Pods = append(u.Pods, r.UID)
		}
		out[k] = u
	}
	return out
}

// persist writes the usage to the state file when it changed.
func (p *Police) persist() error {
	if p.opts.StateFile == "" {
		return nil
	}
	u := p.Usage()
	if reflect.DeepEqual(u, p.written) {
		return nil
	}
	data, err := json.Marshal(u)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.opts.StateFile), 0o755); err != nil {
		return err
	}
	if err := atomicfile.Write(p.opts.StateFile, data, 0o644); err != nil {
		return fmt.Errorf("GPU share usage: %w", err)
	}
	p.written = u
	return nil
}

// ReadUsage reads a state file the loop wrote; a missing file is empty.
func ReadUsage(path string) (Usage, error) {
	if path == "" {
		return Usage{}, nil
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return Usage{}, nil
	}
	if err != nil {
		return nil, err
	}
	u := Usage{}
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("GPU share usage %s: %w", path, err)
	}
	return u, nil
}

type metrics struct {
	kills      *prometheus.CounterVec
	used       *prometheus.GaugeVec
	slice      *prometheus.GaugeVec
	suppressed *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		kills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_gpu_share_kills_total",
			Help: "Processes killed because their GPU share held more than its memory slice.",
		}, []string{"claim", "share_id"}),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_gpu_share_used_bytes",
			Help: "Device memory a GPU share's processes hold, as NVML last reported.",
		}, []string{"claim", "share_id"}),
		slice: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_gpu_share_slice_bytes",
			Help: "A GPU share's memory slice, the line its used bytes are held to.",
		}, []string{"claim", "share_id"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_gpu_share_kill_reports_suppressed_total",
			Help: "Kills of a GPU share's processes not logged or recorded as a pod event, past the one report per share per interval.",
		}, []string{"claim", "share_id"}),
	}
}

func (m *metrics) forget(claim, share string) {
	m.kills.DeleteLabelValues(claim, share)
	m.used.DeleteLabelValues(claim, share)
	m.slice.DeleteLabelValues(claim, share)
	m.suppressed.DeleteLabelValues(claim, share)
}

// Describe implements prometheus.Collector.
func (p *Police) Describe(ch chan<- *prometheus.Desc) {
	p.metrics.kills.Describe(ch)
	p.metrics.used.Describe(ch)
	p.metrics.slice.Describe(ch)
	p.metrics.suppressed.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Police) Collect(ch chan<- prometheus.Metric) {
	p.metrics.kills.Collect(ch)
	p.metrics.used.Collect(ch)
	p.metrics.slice.Collect(ch)
	p.metrics.suppressed.Collect(ch)
}

package netdev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
)

// Health sources of a NIC, the Condition.Source of what each reports.
const (
	SourceLink   = "link"
	SourceErrors = "errors"
)

// NIC health reasons (taint values).
const (
	ReasonLinkDown        = "LinkDown"
	ReasonErrorRate       = "ErrorRate"
	ReasonDeviceGone      = "DeviceGone"
	ReasonPCIFunctionGone = "PCIFunctionGone"
	ReasonDriverUnbound   = "DriverUnbound"
)

// NICHealth is the NIC kind's health source. Links reports each NIC's
// carrier and operstate after the agent's rediscovery, which the netlink
// link events it watches start at once; Run watches the error counters;
// Gone says why a NIC that vanished did.
type NICHealth struct {
	// Root is the host's root, for sysfs.
	Root string
	// ErrorsPerSecond is the rate of rx/tx errors or drops past which a
	// NIC is degraded; 0 turns the check off.
	ErrorsPerSecond int64
	// Interval is how often the counters are read (5 s when 0).
	Interval time.Duration

	mu sync.Mutex
	// nics maps each published NIC's device name to its interface.
	nics map[string]string
	last map[string]nicCounters
}

// Links reports the link state of every NIC among devices: a NIC without
// carrier, or whose operstate is not up, is degraded (LinkDown).
func (h *NICHealth) Links(devices map[string]slices.Entry, sink health.Sink) {
	nics := map[string]string{}
	for name, e := range devices {
		if e.NIC == nil {
			continue
		}
		nics[name] = e.NIC.Name
		c := health.Condition{Device: name, Source: SourceLink}
		if !e.NIC.LinkUsable() {
			c.Severity, c.Reason = health.Degraded, ReasonLinkDown
			c.Message = fmt.Sprintf("%s: carrier %s, operstate %s", e.NIC.Name, onOff(e.NIC.Carrier), e.NIC.OperState)
		}
		sink.Observe(c)
	}
	h.mu.Lock()
	h.nics = nics
	h.mu.Unlock()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// Gone is the condition of a NIC that discovery no longer finds: lost,
// with the reason its PCI function gives (removed, its driver unbound) or
// DeviceGone where the netdev alone went.
func (h *NICHealth) Gone(device string, nic discovery.NIC) health.Condition {
	c := health.Condition{Device: device, Source: SourceLink, Severity: health.Lost, Reason: ReasonDeviceGone,
		Message: fmt.Sprintf("%s: the interface is gone", nic.Name)}
	if nic.PCI == nil {
		return c
	}
	dir := filepath.Join(h.Root, "sys/bus/pci/devices", nic.PCI.Address)
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		c.Reason, c.Message = ReasonPCIFunctionGone, fmt.Sprintf("%s: PCI function %s removed", nic.Name, nic.PCI.Address)
	} else if _, err := os.Lstat(filepath.Join(dir, "driver")); os.IsNotExist(err) {
		c.Reason, c.Message = ReasonDriverUnbound, fmt.Sprintf("%s: PCI function %s has no driver bound", nic.Name, nic.PCI.Address)
	}
	return c
}

type nicCounters struct {
	at     time.Time
	values map[string]uint64
}

// counterFiles are the counters whose growth degrades a NIC.
var counterFiles = []string{"rx_errors", "tx_errors", "rx_dropped", "tx_dropped"}

func (h *NICHealth) readCounters(ifName string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(counterFiles))
	for _, f := range counterFiles {
		b, err := os.ReadFile(filepath.Join(h.Root, "sys/class/net", ifName, "statistics", f))
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", f, ifName, err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parse %s of %s: %w", f, ifName, err)
		}
		out[f] = v
	}
	return out, nil
}

// CheckCounters reads every published NIC's error counters once and
// reports those growing past the rate since the last read.
func (h *NICHealth) CheckCounters(ctx context.Context, now time.Time, sink health.Sink) {
	if h.ErrorsPerSecond <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]nicCounters{}
	}
	for dev, ifName := range h.nics {
		vals, err := h.readCounters(ifName)
		if err != nil {
			klog.FromContext(ctx).V(4).Info("NIC counters unreadable", "nic", ifName, "err", err)
			delete(h.last, dev)
			continue
		}
		prev, ok := h.last[dev]
		h.last[dev] = nicCounters{at: now, values: vals}
		secs := now.Sub(prev.at).Seconds()
		if !ok || secs <= 0 {
			continue
		}
		c := health.Condition{Device: dev, Source: SourceErrors}
		for _, f := range counterFiles {
			if vals[f] < prev.values[f] {
				continue // reset
			}
			if rate := float64(vals[f]-prev.values[f]) / secs; rate > float64(h.ErrorsPerSecond) {
				c.Severity, c.Reason = health.Degraded, ReasonErrorRate
				c.Message = fmt.Sprintf("%s: %s grew %.0f/s (limit %d/s)", ifName, f, rate, h.ErrorsPerSecond)
				break
			}
		}
		sink.Observe(c)
	}
	for dev := range h.last {
		if _, ok := h.nics[dev]; !ok {
			delete(h.last, dev)
		}
	}
}

// Run reads the error counters every Interval until ctx is done.
func (h *NICHealth) Run(ctx context.Context, sink health.Sink) error {
	every := h.Interval
	if every <= 0 {
		every = 5 * time.Second
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) { h.CheckCounters(ctx, time.Now(), sink) }, every)
	return nil
}

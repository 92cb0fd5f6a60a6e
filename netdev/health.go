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
	// ErrorsPerSecond is the floor of the check: a NIC whose hardware
	// errors grow slower than this is never degraded, whatever their part
	// of its packets; 0 turns the check off.
	ErrorsPerSecond int64
	// ErrorsPerMillion is the part of the packets a NIC handled over a
	// read's interval, in millionths, past which its hardware errors
	// degrade it (DefaultErrorsPerMillion when 0).
	ErrorsPerMillion int64
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

// errorFiles are the counters of hardware errors: what the NIC or its
// driver reports of frames it could not receive or send (CRC, frame,
// FIFO, length and carrier errors sum into rx_errors and tx_errors;
// rx_missed_errors, frames the NIC had no buffer for, does not). Drops
// (rx_dropped, tx_dropped, rx_nohandler) never count: a tenant drives
// them, with a flood of frames the stack does not want (an unknown
// ethertype, a VLAN no one listens on) or a full queue, and a taint from
// them would let any pod evict its neighbours.
var errorFiles = []string{"rx_errors", "tx_errors", "rx_missed_errors"}

// packetFiles are the packets the errors are a part of.
var packetFiles = []string{"rx_packets", "tx_packets"}

// DefaultErrorsPerMillion is NICHealth's part of the packets (1%) past
// which hardware errors degrade a NIC.
const DefaultErrorsPerMillion = 10000

func (h *NICHealth) readCounters(ifName string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(errorFiles)+len(packetFiles))
	for _, f := range append(append([]string{}, errorFiles...), packetFiles...) {
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

// growth is how much counter f grew from prev to cur; false where it went
// back (the driver reset it).
func growth(prev, cur map[string]uint64, f string) (uint64, bool) {
	if cur[f] < prev[f] {
		return 0, false
	}
	return cur[f] - prev[f], true
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
		var errs, pkts uint64
		reset := false
		for _, f := range errorFiles {
			d, ok := growth(prev.values, vals, f)
			reset = reset || !ok
			errs += d
		}
		for _, f := range packetFiles {
			d, ok := growth(prev.values, vals, f)
			reset = reset || !ok
			pkts += d
		}
		perMillion := h.ErrorsPerMillion
		if perMillion <= 0 {
			perMillion = DefaultErrorsPerMillion
		}
		// Errored frames are not always counted as packets: the part is
		// of both.
		rate := float64(errs) / secs
		if !reset && rate >= float64(h.ErrorsPerSecond) && float64(errs)*1e6 > float64(perMillion)*float64(pkts+errs) {
			c.Severity, c.Reason = health.Degraded, ReasonErrorRate
			c.Message = fmt.Sprintf("%s: %d hardware errors in %.0f s (%.0f/s, %.2f%% of %d packets; limits %d/s and %.2f%%): %s",
				ifName, errs, secs, rate, 100*float64(errs)/float64(pkts+errs), pkts, h.ErrorsPerSecond, float64(perMillion)/1e4, grown(prev.values, vals))
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

// grown lists the error counters that grew, with how much.
func grown(prev, cur map[string]uint64) string {
	var parts []string
	for _, f := range errorFiles {
		if d, ok := growth(prev, cur, f); ok && d > 0 {
			parts = append(parts, fmt.Sprintf("%s +%d", f, d))
		}
	}
	return strings.Join(parts, ", ")
}

package gpu

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
)

// Health sources of a GPU, the Condition.Source of what each reports.
const (
	SourceEvents = "nvml-events"
	SourceState  = "nvml-state"
)

// GPU health reasons (taint values); an XID's is "XID<n>".
const (
	ReasonECCDoubleBit    = "ECCDoubleBit"
	ReasonRowRemapPending = "RowRemapPending"
	ReasonRowRemapFailed  = "RowRemapFailed"
	ReasonGPULost         = "GPULost"
)

// fatalXIDs are the XIDs that mean the GPU needs attention (NVIDIA's XID
// catalogue); 79 is the GPU falling off the bus, which loses it.
var fatalXIDs = map[uint64]string{
	48: "double-bit ECC error",
	63: "ECC page retirement or row remap recorded",
	64: "ECC page retirement or row remap failed",
	74: "NVLink error",
	79: "GPU has fallen off the bus",
	92: "high single-bit ECC error rate",
	94: "contained ECC error",
	95: "uncontained ECC error",
}

// benignXIDs are an application's own faults (a bad address, a graphics
// exception, a reset channel, a killed context): the GPU is fine.
var benignXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true}

// ClassifyXID says what an XID does to its GPU: healthy for benign and
// unknown XIDs, degraded for fatal ones, lost for 79 (off the bus); with
// the taint's reason and what the XID means.
func ClassifyXID(xid uint64) (health.Severity, string, string) {
	what, fatal := fatalXIDs[xid]
	switch {
	case benignXIDs[xid]:
		return health.Healthy, "", "an application's fault"
	case !fatal:
		return health.Healthy, "", "not known to harm the GPU"
	case xid == 79:
		return health.Lost, fmt.Sprintf("XID%d", xid), what
	}
	return health.Degraded, fmt.Sprintf("XID%d", xid), what
}

// HealthSource watches the GPUs through NVML: XIDs and double-bit ECC
// errors from an event set, and a GPU lost (GPU_IS_LOST) or with row remaps
// pending or failed from polling. An event taints the GPU and lets the
// tracker's hold-down run at once (it is a moment, not a state): a GPU
// that keeps raising fatal XIDs keeps its taint; a state stays as long as
// NVML answers it.
type HealthSource struct {
	// NVML is a lane of the agent's session: the event wait holds its
	// turn for up to Wait at a time.
	NVML *Session
	// Devices are the published devices: each GPU's (and its MIG
	// devices') names by UUID.
	Devices func() map[string]slices.Entry
	// Wait is how long each event wait lasts (500 ms when 0); Poll how
	// often the state is read (5 s when 0).
	Wait, Poll time.Duration
}

// devicesOf maps each GPU UUID to its published devices.
func (h *HealthSource) devicesOf() map[string][]string {
	out := map[string][]string{}
	for name, e := range h.Devices() {
		if e.GPU != nil {
			out[e.GPU.Device.UUID] = append(out[e.GPU.Device.UUID], name)
		}
	}
	return out
}

func (h *HealthSource) observe(sink health.Sink, uuid string, c health.Condition) {
	for _, name := range h.devicesOf()[uuid] {
		c.Device = name
		sink.Observe(c)
	}
}

// Run watches until ctx is done.
func (h *HealthSource) Run(ctx context.Context, sink health.Sink) error {
	logger := klog.FromContext(ctx)
	wait, poll := h.Wait, h.Poll
	if wait <= 0 {
		wait = 500 * time.Millisecond
	}
	if poll <= 0 {
		poll = 5 * time.Second
	}
	var set nvml.EventSet
	uuids := map[nvml.Device]string{}
	err := h.NVML.Do(ctx, "event set", func(l Library) error {
		var ret nvml.Return
		if set, ret = l.EventSetCreate(); ret != nvml.SUCCESS {
			return nvmlError("event set create", ret)
		}
		n, ret := l.DeviceGetCount()
		if ret != nvml.SUCCESS {
			return nvmlError("device count", ret)
		}
		for i := 0; i < n; i++ {
			dev, ret := l.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				continue
			}
			uuid, ret := dev.GetUUID()
			if ret != nvml.SUCCESS {
				continue
			}
			uuids[dev] = uuid
			types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
			if sup, ret := dev.GetSupportedEventTypes(); ret == nvml.SUCCESS {
				types &= sup
			}
			if ret := dev.RegisterEvents(types, set); ret != nvml.SUCCESS {
				logger.Info("GPU takes no NVML event registration; its XIDs are not watched", "gpu", uuid, "err", nvml.ErrorString(ret))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	defer func() {
		_ = h.NVML.Do(context.WithoutCancel(ctx), "event set free", func(Library) error { _ = set.Free(); return nil })
	}()
	lastPoll := time.Time{}
	for ctx.Err() == nil {
		if time.Since(lastPoll) >= poll {
			h.probe(ctx, sink, uuids)
			lastPoll = time.Now()
		}
		var data nvml.EventData
		var ret nvml.Return
		if err := h.NVML.Do(ctx, "event wait", func(Library) error {
			data, ret = set.Wait(uint32(wait.Milliseconds()))
			return nil
		}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("wait for GPU events: %w", err)
		}
		switch ret {
		case nvml.SUCCESS:
			h.event(ctx, sink, uuids[data.Device], data)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			h.probe(ctx, sink, uuids)
			lastPoll = time.Now()
		default:
			logger.V(2).Info("NVML event wait", "err", nvml.ErrorString(ret))
			time.Sleep(wait)
		}
	}
	return nil
}

// event reports an event: a fatal XID or a double-bit ECC error taints the
// GPU, and its hold-down starts at once.
func (h *HealthSource) event(ctx context.Context, sink health.Sink, uuid string, data nvml.EventData) {
	var c health.Condition
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		sev, reason, what := ClassifyXID(data.EventData)
		if sev == health.Healthy {
			klog.FromContext(ctx).V(2).Info("GPU XID, not fatal to the GPU", "gpu", uuid, "xid", data.EventData, "why", what)
			return
		}
		c = health.Condition{Source: SourceEvents, Severity: sev, Reason: reason, Message: fmt.Sprintf("%s: XID %d, %s", uuid, data.EventData, what)}
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		c = health.Condition{Source: SourceEvents, Severity: health.Degraded, Reason: ReasonECCDoubleBit, Message: uuid + ": double-bit ECC error"}
	default:
		return
	}
	klog.FromContext(ctx).Info("GPU event", "gpu", uuid, "reason", c.Reason, "message", c.Message)
	h.observe(sink, uuid, c)
	h.observe(sink, uuid, health.Condition{Source: SourceEvents})
}

// probe reads each GPU's state: lost, row remaps pending or failed.
func (h *HealthSource) probe(ctx context.Context, sink health.Sink, uuids map[nvml.Device]string) {
	for dev, uuid := range uuids {
		var pending, failed bool
		var ret nvml.Return
		if err := h.NVML.Do(ctx, "remapped rows", func(Library) error {
			_, _, pending, failed, ret = dev.GetRemappedRows()
			return nil
		}); err != nil {
			klog.FromContext(ctx).V(2).Info("GPU state", "gpu", uuid, "err", err)
			continue
		}
		c := health.Condition{Source: SourceState}
		switch {
		case ret == nvml.ERROR_GPU_IS_LOST:
			c.Severity, c.Reason, c.Message = health.Lost, ReasonGPULost, uuid+": NVML answers GPU_IS_LOST"
		case ret != nvml.SUCCESS:
		case failed:
			c.Severity, c.Reason, c.Message = health.Degraded, ReasonRowRemapFailed, uuid+": a row remap failed"
		case pending:
			c.Severity, c.Reason, c.Message = health.Degraded, ReasonRowRemapPending, uuid+": row remaps pending (a reset applies them)"
		}
		h.observe(sink, uuid, c)
	}
}

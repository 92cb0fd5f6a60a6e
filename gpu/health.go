package gpu

import (
	"context"
	"encoding/binary"
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
	SourceLane   = "nvml-lane"
	// SourceRecovery is the recovery action the driver asks, read at each
	// poll (r570 on).
	SourceRecovery = "nvml-recovery-action"
)

// GPU health reasons (taint values); an XID's is "XID<n>".
const (
	ReasonECCDoubleBit    = "ECCDoubleBit"
	ReasonRowRemapPending = "RowRemapPending"
	ReasonRowRemapFailed  = "RowRemapFailed"
	ReasonGPULost         = "GPULost"
	ReasonNVMLHung        = "NVMLHung"
)

// appXIDs are the XIDs of an application's own fault, which leave the GPU
// fine: the list NVIDIA's device plugin skips (its "application errors").
// Every other XID taints: an allow-list of harmful XIDs let new and
// unlisted ones (119 and 120, GSP timeouts, common on Hopper; 61, 62, 140,
// 143, 154...) count as healthy.
var appXIDs = map[uint64]string{
	13: "graphics engine exception",
	31: "GPU memory page fault",
	43: "GPU stopped processing (a channel reset)",
	45: "preemptive cleanup (a context killed)",
	68: "video processor exception",
}

// xidMeanings are what some tainting XIDs mean (NVIDIA's XID catalogue),
// for the taint's message; an XID not here taints all the same.
var xidMeanings = map[uint64]string{
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remap recorded",
	64:  "ECC page retirement or row remap failed",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// ClassifyXID says what an XID does to its GPU: healthy for an
// application's fault (appXIDs), lost for 79 (off the bus), degraded for
// every other; with the taint's reason and what the XID means.
func ClassifyXID(xid uint64) (health.Severity, string, string) {
	if what, ok := appXIDs[xid]; ok {
		return health.Healthy, "", "an application's fault: " + what
	}
	what, ok := xidMeanings[xid]
	if !ok {
		what = "see NVIDIA's XID catalogue"
	}
	if xid == 79 {
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
	// Wedged, when set, says why a GPU's own NVML lane (the policing
	// loop's, Lanes) is wedged: a call hung in the driver for it. Such
	// a GPU is degraded (NVMLHung) while it lasts: its shares are no
	// longer held to their slices.
	Wedged func(uuid string) error
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

// maxLostBackoff bounds the wait between event waits while the event set
// keeps answering GPU_IS_LOST for a GPU no probe finds lost.
const maxLostBackoff = 30 * time.Second

// Run watches until ctx is done. A lost GPU is left out of the event set
// (a real driver answers every later wait of a set holding it with
// GPU_IS_LOST at once, which spun the loop at a full core) and probed at
// the poll's pace until it answers again; where the set still answers
// GPU_IS_LOST the waits back off.
func (h *HealthSource) Run(ctx context.Context, sink health.Sink) error {
	logger := klog.FromContext(ctx)
	wait, poll := h.Wait, h.Poll
	if wait <= 0 {
		wait = 500 * time.Millisecond
	}
	if poll <= 0 {
		poll = 5 * time.Second
	}
	uuids, err := h.gpus(ctx)
	if err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	lost := map[string]bool{}
	var set nvml.EventSet
	rebuild := func() error {
		free(ctx, h.NVML, set)
		set = nil
		var err error
		if set, err = h.eventSet(ctx, uuids, lost); err != nil {
			set = nil
		}
		return err
	}
	if err := rebuild(); err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	defer func() { free(ctx, h.NVML, set) }()
	// Later, a set that cannot be made again is tried at the next poll;
	// the polled state is watched meanwhile.
	again := func() {
		if err := rebuild(); err != nil {
			logger.Error(err, "GPU events are not watched until the next poll")
		}
	}
	lastPoll := time.Time{}
	var backoff time.Duration
	for ctx.Err() == nil {
		if time.Since(lastPoll) >= poll {
			changed := h.probe(ctx, sink, uuids, lost)
			lastPoll = time.Now()
			if changed || set == nil {
				again()
			}
		}
		if set == nil {
			sleep(ctx, wait)
			continue
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
			backoff = 0
			h.event(ctx, sink, uuids[data.Device], data)
		case nvml.ERROR_TIMEOUT:
			backoff = 0
		case nvml.ERROR_GPU_IS_LOST:
			changed := h.probe(ctx, sink, uuids, lost)
			lastPoll = time.Now()
			if changed {
				again()
				continue
			}
			backoff = min(max(2*backoff, wait), maxLostBackoff)
			logger.V(2).Info("NVML event wait answers GPU_IS_LOST, no GPU probes lost; waiting", "wait", backoff)
			sleep(ctx, backoff)
		default:
			logger.V(2).Info("NVML event wait", "err", nvml.ErrorString(ret))
			sleep(ctx, wait)
		}
	}
	return nil
}

// gpus are the node's GPUs, by handle: their UUIDs.
func (h *HealthSource) gpus(ctx context.Context) (map[nvml.Device]string, error) {
	uuids := map[nvml.Device]string{}
	err := h.NVML.Do(ctx, "GPUs", func(l Library) error {
		n, ret := l.DeviceGetCount()
		if ret != nvml.SUCCESS {
			return nvmlError("device count", ret)
		}
		for i := 0; i < n; i++ {
			dev, ret := l.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				continue
			}
			if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
				uuids[dev] = uuid
			}
		}
		return nil
	})
	return uuids, err
}

// eventSet is a new event set with every GPU not lost registered for
// XIDs, double-bit ECC errors and, where the driver has them (r570 on),
// a GPU becoming unavailable or asking for a recovery action.
func (h *HealthSource) eventSet(ctx context.Context, uuids map[nvml.Device]string, lost map[string]bool) (nvml.EventSet, error) {
	var set nvml.EventSet
	err := h.NVML.Do(ctx, "event set", func(l Library) error {
		var ret nvml.Return
		if set, ret = l.EventSetCreate(); ret != nvml.SUCCESS {
			return nvmlError("event set create", ret)
		}
		for dev, uuid := range uuids {
			if lost[uuid] {
				continue
			}
			types := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuUnavailableError | nvml.EventTypeGpuRecoveryAction)
			if sup, ret := dev.GetSupportedEventTypes(); ret == nvml.SUCCESS {
				types &= sup
			} else {
				types &= nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError
			}
			if ret := dev.RegisterEvents(types, set); ret != nvml.SUCCESS {
				klog.FromContext(ctx).Info("GPU takes no NVML event registration; its XIDs are not watched", "gpu", uuid, "err", nvml.ErrorString(ret))
			}
		}
		return nil
	})
	return set, err
}

// free frees an event set (nil: none).
func free(ctx context.Context, s *Session, set nvml.EventSet) {
	if set == nil {
		return
	}
	_ = s.Do(context.WithoutCancel(ctx), "event set free", func(Library) error { _ = set.Free(); return nil })
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// noInstance is the GPU-instance id of an event that is not of one MIG
// instance (NVML's API reference: 0xFFFFFFFF).
const noInstance = 0xFFFFFFFF

// recoveryCondition is what a recovery action the driver asks does to its
// GPU: a reboot loses it (nothing short of one brings it back); a reset, a
// drain or the IMEX domain's recovery degrades it; none leaves it healthy.
func recoveryCondition(uuid string, action nvml.DeviceGpuRecoveryAction) health.Condition {
	switch action {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return health.Condition{}
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return health.Condition{Severity: health.Lost, Reason: ReasonRecoveryReboot, Message: fmt.Sprintf("%s: the driver asks for a reboot (recovery action %d)", uuid, action)}
	default:
		return health.Condition{Severity: health.Degraded, Reason: ReasonRecoveryReset, Message: fmt.Sprintf("%s: the driver asks for a reset or drain (recovery action %d)", uuid, action)}
	}
}

// recoveryAction reads the recovery action the driver asks of dev
// (FI_DEV_GET_GPU_RECOVERY_ACTION, r570 on); false where NVML has no
// answer (an older driver: NOT_SUPPORTED).
func recoveryAction(dev nvml.Device) (nvml.DeviceGpuRecoveryAction, bool) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret != nvml.SUCCESS || nvml.Return(values[0].NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	v, ok := fieldUint(values[0])
	return nvml.DeviceGpuRecoveryAction(v), ok
}

// fieldUint is a field value of an integer type.
func fieldUint(v nvml.FieldValue) (uint64, bool) {
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(v.Value[:4])), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return binary.LittleEndian.Uint64(v.Value[:]), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(v.Value[:2])), true
	default:
		return 0, false
	}
}

// GPU health reasons of the r570 events.
const (
	ReasonGPUUnavailable = "GPUUnavailable"
	ReasonRecoveryReset  = "RecoveryReset"
	ReasonRecoveryReboot = "RecoveryReboot"
)

// event reports an event: a tainting XID, a double-bit ECC error, a GPU
// unavailable or asking to be reset or the node rebooted taints the GPU
// (an XID of one MIG instance only that instance's devices), and its
// hold-down starts at once.
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
	case data.EventType&nvml.EventTypeGpuUnavailableError != 0:
		c = health.Condition{Source: SourceEvents, Severity: health.Lost, Reason: ReasonGPUUnavailable, Message: uuid + ": NVML reports the GPU unavailable"}
	case data.EventType&nvml.EventTypeGpuRecoveryAction != 0:
		c = recoveryCondition(uuid, nvml.DeviceGpuRecoveryAction(data.EventData))
		if c.Severity == health.Healthy {
			return
		}
		c.Source = SourceEvents
	default:
		return
	}
	devices := h.devicesOf()[uuid]
	if data.GpuInstanceId != noInstance && data.EventType&nvml.EventTypeXidCriticalError != 0 && c.Severity != health.Lost {
		// One instance's contained fault: its tenant's, not the
		// card's. Where the instance cannot be placed, the whole GPU.
		if pl, ok := h.instancePlacement(ctx, data.Device, data.GpuInstanceId); ok {
			devices = h.devicesIn(uuid, pl)
			c.Message += fmt.Sprintf(" (MIG GPU instance %d, slices %d-%d)", data.GpuInstanceId, pl.Start, pl.Start+pl.Size-1)
		}
	}
	klog.FromContext(ctx).Info("GPU event", "gpu", uuid, "reason", c.Reason, "message", c.Message, "devices", len(devices))
	for _, name := range devices {
		c.Device = name
		sink.Observe(c)
		sink.Observe(health.Condition{Source: SourceEvents, Device: name})
	}
}

// instancePlacement finds where the GPU instance with id sits on dev.
func (h *HealthSource) instancePlacement(ctx context.Context, dev nvml.Device, id uint32) (nvml.GpuInstancePlacement, bool) {
	var out nvml.GpuInstancePlacement
	found := false
	_ = h.NVML.Do(ctx, "GPU instance placement", func(Library) error {
		EachGPUInstance(dev, func(_ nvml.GpuInstanceProfileInfo, info nvml.GpuInstanceInfo) bool {
			if info.Id == id {
				out, found = info.Placement, true
			}
			return !found
		})
		return nil
	})
	return out, found
}

// devicesIn are the GPU's published MIG devices whose placement shares a
// slice with pl.
func (h *HealthSource) devicesIn(uuid string, pl nvml.GpuInstancePlacement) []string {
	var out []string
	start, end := int(pl.Start), int(pl.Start+pl.Size)
	for name, e := range h.Devices() {
		if e.GPU == nil || e.GPU.Device.UUID != uuid || e.GPU.MIG == nil {
			continue
		}
		p := e.GPU.MIG.Placement
		if p.Start < end && start < p.Start+p.Size {
			out = append(out, name)
		}
	}
	return out
}

// probe reads each GPU's state: lost, row remaps pending or failed. It
// records in lost which GPUs answer GPU_IS_LOST, and says whether that
// changed.
func (h *HealthSource) probe(ctx context.Context, sink health.Sink, uuids map[nvml.Device]string, lost map[string]bool) (changed bool) {
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
		if isLost := ret == nvml.ERROR_GPU_IS_LOST; isLost != lost[uuid] {
			changed = true
			if isLost {
				lost[uuid] = true
			} else {
				delete(lost, uuid)
			}
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
		// The recovery action the driver asks is a state, not only the
		// moment of its event: it lasts until the reset or reboot.
		recovery := health.Condition{Source: SourceRecovery}
		if ret != nvml.ERROR_GPU_IS_LOST {
			var action nvml.DeviceGpuRecoveryAction
			var known bool
			_ = h.NVML.Do(ctx, "recovery action", func(Library) error {
				action, known = recoveryAction(dev)
				return nil
			})
			if known {
				recovery = recoveryCondition(uuid, action)
				recovery.Source = SourceRecovery
			}
		}
		h.observe(sink, uuid, recovery)
		if h.Wedged != nil {
			hung := health.Condition{Source: SourceLane}
			if err := h.Wedged(uuid); err != nil {
				hung.Severity, hung.Reason, hung.Message = health.Degraded, ReasonNVMLHung, err.Error()
			}
			h.observe(sink, uuid, hung)
		}
	}
	return changed
}

package nvmlinfo

import "fmt"

// Event is an NVML event a replay delivers the way the card would: through
// NVML's event sets (EventSetCreate, RegisterEvents, Wait) or, for a GPU
// that is lost or has row remaps pending, in the answers of its device
// calls. Only replay files carry events; `carve snapshot` writes none.
type Event struct {
	// AfterMs is when the event happens, in milliseconds after the replay
	// is loaded (the agent's start).
	AfterMs int64 `json:"afterMs"`
	// UUID is the GPU's.
	UUID string `json:"uuid"`
	// Type is one of the Event* constants.
	Type string `json:"type"`
	// XID is the XID of an "xid" event.
	XID uint64 `json:"xid,omitempty"`
	// GPUInstance is, for an "xid" event of one MIG instance, the id of
	// its GPU instance (NVML's EventData.GpuInstanceId); absent for an
	// XID of the whole GPU.
	GPUInstance *uint32 `json:"gpuInstance,omitempty"`
	// RecoveryAction is, for a "recoveryAction" event, what the driver
	// asks (NVML's nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset,
	// 2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover the IMEX
	// domain, 6 bus reset, 7 system reboot).
	RecoveryAction *uint32 `json:"recoveryAction,omitempty"`
}

// Event types a replay file may give.
const (
	// EventXID is an XID (NVML's EventTypeXidCriticalError).
	EventXID = "xid"
	// EventDoubleBitECC is a double-bit ECC error (EventTypeDoubleBitEccError).
	EventDoubleBitECC = "doubleBitEcc"
	// EventRowRemapPending and EventRowRemapFailed set what
	// GetRemappedRows answers from then on.
	EventRowRemapPending = "rowRemapPending"
	EventRowRemapFailed  = "rowRemapFailed"
	// EventGPULost makes the GPU's calls answer GPU_IS_LOST from then on.
	EventGPULost = "gpuLost"
	// EventRecoveryAction is the driver asking for a recovery action
	// (r570 on): an EventTypeGpuRecoveryAction event, and what the
	// FI_DEV_GET_GPU_RECOVERY_ACTION field answers from then on.
	EventRecoveryAction = "recoveryAction"
	// EventRecovered undoes lost, row remaps and a recovery action (a
	// reset).
	EventRecovered = "recovered"
)

// maxRecoveryAction is the highest recovery action NVML defines (system
// reboot).
const maxRecoveryAction = 7

func (inv *Inventory) validateEvents() error {
	uuids := map[string]bool{}
	for _, d := range inv.Devices {
		uuids[d.UUID] = true
	}
	for i, e := range inv.Events {
		field := fmt.Sprintf("events[%d]", i)
		switch {
		case e.AfterMs < 0:
			return fmt.Errorf("%s.afterMs: negative", field)
		case !uuids[e.UUID]:
			return fmt.Errorf("%s.uuid: %q is no device of the file", field, e.UUID)
		}
		switch e.Type {
		case EventXID:
			if e.XID == 0 {
				return fmt.Errorf("%s: an xid event needs its xid", field)
			}
		case EventRecoveryAction:
			if e.RecoveryAction == nil || *e.RecoveryAction > maxRecoveryAction {
				return fmt.Errorf("%s: a recoveryAction event needs its recoveryAction, 0 to %d", field, maxRecoveryAction)
			}
		case EventDoubleBitECC, EventRowRemapPending, EventRowRemapFailed, EventGPULost, EventRecovered:
		default:
			return fmt.Errorf("%s.type: %q is not one of xid, doubleBitEcc, rowRemapPending, rowRemapFailed, gpuLost, recoveryAction, recovered", field, e.Type)
		}
		if e.Type != EventXID && (e.XID != 0 || e.GPUInstance != nil) {
			return fmt.Errorf("%s: xid and gpuInstance are for xid events only", field)
		}
		if e.Type != EventRecoveryAction && e.RecoveryAction != nil {
			return fmt.Errorf("%s: recoveryAction is for recoveryAction events only", field)
		}
	}
	return nil
}

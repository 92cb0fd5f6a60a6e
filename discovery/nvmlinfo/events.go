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
	// EventRecovered undoes lost and row remaps (a reset).
	EventRecovered = "recovered"
)

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
		case EventDoubleBitECC, EventRowRemapPending, EventRowRemapFailed, EventGPULost, EventRecovered:
			if e.XID != 0 || e.GPUInstance != nil {
				return fmt.Errorf("%s: xid and gpuInstance are for xid events only", field)
			}
		default:
			return fmt.Errorf("%s.type: %q is not one of xid, doubleBitEcc, rowRemapPending, rowRemapFailed, gpuLost, recovered", field, e.Type)
		}
	}
	return nil
}

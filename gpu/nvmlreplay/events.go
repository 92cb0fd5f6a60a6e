package nvmlreplay

import (
	"encoding/binary"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// events delivers the file's events as the card would: XIDs and ECC errors
// through event sets, lost GPUs and row remaps in the device's answers.
type events struct {
	mu    sync.Mutex
	start time.Time
	// due are the events not yet happened, by time.
	due   []timedEvent
	devs  map[string]*server.Device
	state map[string]*deviceState
	sets  map[nvml.EventSet]*eventSet
	// calls counts the health calls answered: event set creations,
	// registrations, supported-event questions, waits and row-remap
	// reads.
	calls atomic.Int64
}

type timedEvent struct {
	at time.Time
	e  nvmlinfo.Event
}

type deviceState struct {
	lost, remapPending, remapFailed bool
	// recovery is the recovery action the driver asks (r570 on).
	recovery uint32
}

type eventSet struct {
	// regs are the event types registered, by GPU UUID.
	regs  map[string]uint64
	queue []queued
	wake  chan struct{}
}

type queued struct {
	data nvml.EventData
	ret  nvml.Return
}

func newEvents(start time.Time, evs []nvmlinfo.Event) *events {
	x := &events{start: start, devs: map[string]*server.Device{}, state: map[string]*deviceState{}, sets: map[nvml.EventSet]*eventSet{}}
	for _, e := range evs {
		x.due = append(x.due, timedEvent{at: start.Add(time.Duration(e.AfterMs) * time.Millisecond), e: e})
	}
	sort.SliceStable(x.due, func(i, j int) bool { return x.due[i].at.Before(x.due[j].at) })
	return x
}

// Inject makes the event happen now, whatever its AfterMs.
func (r *Replay) Inject(e nvmlinfo.Event) {
	x := r.events
	x.mu.Lock()
	x.due = append([]timedEvent{{at: time.Now(), e: e}}, x.due...)
	x.happen(time.Now())
	x.mu.Unlock()
}

// happen applies the events due by now; x.mu is held.
func (x *events) happen(now time.Time) {
	for len(x.due) > 0 && !x.due[0].at.After(now) {
		e := x.due[0].e
		x.due = x.due[1:]
		dev, ok := x.devs[e.UUID]
		if !ok {
			continue
		}
		st := x.state[e.UUID]
		var data nvml.EventData
		ret := nvml.SUCCESS
		switch e.Type {
		case nvmlinfo.EventXID:
			data = nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: e.XID,
				GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
			if e.GPUInstance != nil {
				data.GpuInstanceId = *e.GPUInstance
			}
		case nvmlinfo.EventDoubleBitECC:
			data = nvml.EventData{Device: dev, EventType: nvml.EventTypeDoubleBitEccError}
		case nvmlinfo.EventRecoveryAction:
			st.recovery = *e.RecoveryAction
			data = nvml.EventData{Device: dev, EventType: nvml.EventTypeGpuRecoveryAction, EventData: uint64(st.recovery),
				GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
		case nvmlinfo.EventRowRemapPending:
			st.remapPending = true
			continue
		case nvmlinfo.EventRowRemapFailed:
			st.remapFailed = true
			continue
		case nvmlinfo.EventRecovered:
			*st = deviceState{}
			continue
		case nvmlinfo.EventGPULost:
			// Every wait of a set holding it answers GPU_IS_LOST from
			// now on (lostIn), as a real driver's does.
			st.lost = true
			for _, s := range x.sets {
				if _, ok := s.regs[e.UUID]; ok {
					select {
					case s.wake <- struct{}{}:
					default:
					}
				}
			}
			continue
		}
		for _, s := range x.sets {
			mask, ok := s.regs[e.UUID]
			if !ok || (ret == nvml.SUCCESS && mask&data.EventType == 0) {
				continue
			}
			s.queue = append(s.queue, queued{data, ret})
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// noInstance is NVML's GPU-instance id of an event of no MIG instance.
const noInstance = 0xFFFFFFFF

// lostIn says whether a GPU registered in s is lost; x.mu is held.
func (x *events) lostIn(s *eventSet) bool {
	for uuid := range s.regs {
		if x.state[uuid].lost {
			return true
		}
	}
	return false
}

// Calls is how many health calls the replay has answered: event set
// creations, event registrations, supported-event questions, waits and
// row-remap reads.
func (r *Replay) Calls() int64 { return r.events.calls.Load() }

// next is when the next event is due; zero where none is.
func (x *events) next() time.Time {
	if len(x.due) == 0 {
		return time.Time{}
	}
	return x.due[0].at
}

// supportedEvents are the event types a replayed GPU takes; a driver of
// r570 on also takes the GPU-unavailable and recovery-action events
// (nvml.h of r570; what a card lists is not recorded).
const (
	supportedEvents     = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError
	supportedEventsR570 = supportedEvents | nvml.EventTypeGpuUnavailableError | nvml.EventTypeGpuRecoveryAction
)

func (x *events) newSet() (nvml.EventSet, nvml.Return) {
	x.calls.Add(1)
	s := &eventSet{regs: map[string]uint64{}, wake: make(chan struct{}, 1)}
	m := &mock.EventSet{}
	m.FreeFunc = func() nvml.Return {
		x.mu.Lock()
		defer x.mu.Unlock()
		delete(x.sets, m)
		return nvml.SUCCESS
	}
	m.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
		x.calls.Add(1)
		deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
		for {
			x.mu.Lock()
			x.happen(time.Now())
			if x.lostIn(s) {
				x.mu.Unlock()
				return nvml.EventData{}, nvml.ERROR_GPU_IS_LOST
			}
			if len(s.queue) > 0 {
				q := s.queue[0]
				s.queue = s.queue[1:]
				x.mu.Unlock()
				return q.data, q.ret
			}
			until := deadline
			if n := x.next(); !n.IsZero() && n.Before(until) {
				until = n
			}
			x.mu.Unlock()
			wait := time.Until(until)
			if wait <= 0 && !time.Now().Before(deadline) {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			t := time.NewTimer(max(wait, 0))
			select {
			case <-t.C:
			case <-s.wake:
			}
			t.Stop()
		}
	}
	x.mu.Lock()
	x.sets[m] = s
	x.mu.Unlock()
	return m, nvml.SUCCESS
}

// device makes a mock device take event registrations and answer as its
// state says; r570 says whether its driver is r570 or later, which has the
// recovery action.
func (x *events) device(m *server.Device, uuid string, r570 bool) {
	x.devs[uuid] = m
	x.state[uuid] = &deviceState{}
	supported := uint64(supportedEvents)
	if r570 {
		supported = supportedEventsR570
	}
	m.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		x.calls.Add(1)
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.state[uuid].lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return supported, nvml.SUCCESS
	}
	m.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
		x.calls.Add(1)
		x.mu.Lock()
		defer x.mu.Unlock()
		s, ok := x.sets[set]
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if x.state[uuid].lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		if types&^supported != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		s.regs[uuid] |= types
		return nvml.SUCCESS
	}
	// A lost GPU's own questions fail, as a real one's do; its
	// identity (UUID, index, PCI bus) the driver still answers.
	memoryInfo := m.GetMemoryInfoFunc
	m.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		x.mu.Lock()
		x.happen(time.Now())
		lost := x.state[uuid].lost
		x.mu.Unlock()
		if lost {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return memoryInfo()
	}
	m.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		x.calls.Add(1)
		x.mu.Lock()
		defer x.mu.Unlock()
		x.happen(time.Now())
		st := x.state[uuid]
		if st.lost {
			return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST
		}
		return 0, 0, st.remapPending, st.remapFailed, nvml.SUCCESS
	}
}

// fieldValues answers NVML's field values as a card does: each value its
// own return, NOT_SUPPORTED for a field the replay does not know; the
// recovery action where the driver has it (r570 on).
func (x *events) fieldValues(uuid string, r570 bool) func([]nvml.FieldValue) nvml.Return {
	return func(values []nvml.FieldValue) nvml.Return {
		x.calls.Add(1)
		if len(values) == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		x.mu.Lock()
		defer x.mu.Unlock()
		x.happen(time.Now())
		st := x.state[uuid]
		if st.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		for i := range values {
			v := &values[i]
			v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			if v.FieldId == nvml.FI_DEV_GET_GPU_RECOVERY_ACTION && r570 {
				v.NvmlReturn, v.ValueType = uint32(nvml.SUCCESS), uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				binary.LittleEndian.PutUint32(v.Value[:4], st.recovery)
			}
			v.Timestamp = time.Now().UnixMicro()
		}
		return nvml.SUCCESS
	}
}

package estimate

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// stateKey is where the estimate lives in a cycle, shared by the plugins that
// score by it so that it is computed once per pod.
const stateKey fwk.StateKey = "carve.dev/share-estimate"

// markKey prefixes where a cycle keeps the mark of a driver's ledger.
const markKey = "carve.dev/ledger-mark/"

// cycleData wraps an estimate (nil for a pod without shares) for CycleState.
type cycleData struct {
	driver string
	e      *Estimate
}

// Clone shares the estimate: it is never modified after Compute.
func (c *cycleData) Clone() fwk.StateData { return c }

// markData is the ledger's mark taken in PreFilter.
type markData struct{ at uint64 }

func (m *markData) Clone() fwk.StateData { return m }

// MarkCycle records in state the ledger as it is now, right after
// DynamicResources' PreFilter took the snapshot its allocator works from
// (carve's plugins come after the default ones), so that the pod's
// estimate reads the ledger as of that moment. It first drops the in-flight
// allocations the tracker has finished with, as that snapshot did.
func MarkCycle(state fwk.CycleState, dra fwk.SharedDRAManager, ledger *Ledger, driver string) {
	key := fwk.StateKey(markKey + driver)
	if _, err := state.Read(key); err == nil {
		return // the other plugin marked it
	}
	state.Write(key, &markData{at: settleAndMark(dra, ledger)})
}

func settleAndMark(dra fwk.SharedDRAManager, ledger *Ledger) uint64 {
	ledger.Settle(dra.ResourceClaims())
	return ledger.Mark()
}

// ForCycle returns the pod's estimate for this cycle, computing it on the
// first call and storing it in state for the next plugin. Without a mark
// from PreFilter it reads the ledger as it is now.
func ForCycle(ctx context.Context, state fwk.CycleState, dra fwk.SharedDRAManager, ledger *Ledger, pod *v1.Pod, driver string) (*Estimate, error) {
	if d, err := state.Read(stateKey); err == nil {
		if c, ok := d.(*cycleData); ok && c.driver == driver {
			return c.e, nil
		}
	} else if !errors.Is(err, fwk.ErrNotFound) {
		return nil, err
	}
	var at uint64
	if d, err := state.Read(fwk.StateKey(markKey + driver)); err == nil {
		at = d.(*markData).at
	} else {
		at = settleAndMark(dra, ledger)
	}
	e, err := Compute(ctx, dra, ledger, pod, driver, at)
	if err != nil {
		return nil, err
	}
	state.Write(stateKey, &cycleData{driver: driver, e: e})
	return e, nil
}

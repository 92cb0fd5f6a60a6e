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

// cycleData wraps an estimate (nil for a pod without shares) for CycleState.
type cycleData struct {
	driver string
	e      *Estimate
}

// Clone shares the estimate: it is never modified after Compute.
func (c *cycleData) Clone() fwk.StateData { return c }

// ForCycle returns the pod's estimate for this cycle, computing it on the
// first call and storing it in state for the next plugin.
func ForCycle(ctx context.Context, state fwk.CycleState, dra fwk.SharedDRAManager, ledger *Ledger, pod *v1.Pod, driver string) (*Estimate, error) {
	if d, err := state.Read(stateKey); err == nil {
		if c, ok := d.(*cycleData); ok && c.driver == driver {
			return c.e, nil
		}
	} else if !errors.Is(err, fwk.ErrNotFound) {
		return nil, err
	}
	e, err := Compute(ctx, dra, ledger, pod, driver)
	if err != nil {
		return nil, err
	}
	state.Write(stateKey, &cycleData{driver: driver, e: e})
	return e, nil
}

package prepare

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/slices"
)

// Allocation is one device of a claim that this driver must prepare: what the
// scheduler allocated, with the share and the configuration that apply.
type Allocation struct {
	ClaimUID       types.UID `json:"claimUID"`
	ClaimNamespace string    `json:"claimNamespace"`
	ClaimName      string    `json:"claimName"`
	Request        string    `json:"request"`
	Pool           string    `json:"pool"`
	Device         string    `json:"device"`
	Kind           string    `json:"kind"`
	// ShareID is set when the device allows multiple allocations.
	ShareID *types.UID `json:"shareID,omitempty"`
	// Consumed is the capacity this share consumes, by capacity name.
	Consumed map[resourceapi.QualifiedName]resource.Quantity `json:"consumed,omitempty"`
	// Config is the effective opaque configuration, already decoded and
	// validated, in its versioned JSON form.
	Config json.RawMessage `json:"config,omitempty"`
}

// ShareKey identifies the allocation among all on the node: the claim and
// the share, or the claim and the device where the device is not shared.
// Preparers derive the names of what they create from it, so that they can
// undo an allocation from its record alone after a crash.
func (a Allocation) ShareKey() string {
	id := a.Device
	if a.ShareID != nil {
		id = string(*a.ShareID)
	}
	return string(a.ClaimUID) + "/" + a.Request + "/" + id
}

// EnvPrefix is the prefix of the environment variables that describe this
// allocation to a container: CARVE_<REQUEST>_, so that several devices in
// one container do not overwrite each other.
func (a Allocation) EnvPrefix() string { return "CARVE_" + envToken(a.Request) + "_" }

// Prepared is what a preparer made of one allocation.
type Prepared struct {
	// Edits are applied to every container that uses the device.
	Edits cdispec.ContainerEdits
	// Undo is the preparer's own record of what to remove; it is stored
	// in the checkpoint and handed back to Unprepare.
	Undo json.RawMessage
	// Network, for network devices, is reported in the claim's
	// status.devices (KEP-4817): interface name, addresses, MAC.
	Network *resourceapi.NetworkDeviceData
}

// Restorer is implemented by preparers that keep state in memory (address
// pools, class numbers): at start the agent hands them the allocations and
// undo records (nil for claims not completed) of every claim in the
// checkpoint, which is the truth their kernel state must agree with.
type Restorer interface {
	Restore(allocs []Allocation, undo []json.RawMessage)
}

// Preparer is the contract a device kind implements to be prepared by carve:
// netdev.NICPreparer for NICs, fpga.Preparer and llc.Preparer. The driver decodes and validates the claim's configuration, checks
// conflicts and capacity, records every step in the checkpoint and writes
// the CDI spec; a preparer only makes the device usable on the host and
// returns the container edits and an undo record.
//
// Implementations must be idempotent, and Unprepare must undo a partial
// Prepare given only the allocation (undo is nil when the crash came before
// Prepare returned): preparers derive the names of what they create from
// Allocation.ShareKey for that reason. Preparers never touch the checkpoint
// or CDI files themselves.
type Preparer interface {
	Prepare(ctx context.Context, alloc Allocation, dev slices.Entry) (Prepared, error)
	Unprepare(ctx context.Context, alloc Allocation, undo json.RawMessage) error
}

// ClaimCleaner is implemented by preparers that keep their own record of
// what they made on the node (netdev's attach specs, llc's and gpu/prep's
// records): asked to unprepare a claim the checkpoint does not know, the
// driver has them remove whatever they still hold of it, so that a lost
// record never leaks kernel state.
type ClaimCleaner interface {
	UnprepareClaim(ctx context.Context, claimUID types.UID) error
}

// OverCapacityError is CheckCapacity's refusal.
type OverCapacityError struct{ msg string }

func (e *OverCapacityError) Error() string { return e.msg }

// CheckCapacity reports whether a share's consumption fits beside the others
// already prepared on the device.
func CheckCapacity(dev slices.Entry, alloc Allocation, others []Allocation) error {
	for name, want := range alloc.Consumed {
		capacity, ok := dev.Device.Capacity[name]
		if !ok {
			return fmt.Errorf("device %s has no capacity %q", dev.Device.Name, name)
		}
		used := want.DeepCopy()
		for _, o := range others {
			if q, ok := o.Consumed[name]; ok {
				used.Add(q)
			}
		}
		if used.Cmp(capacity.Value) > 0 {
			inUse := used.DeepCopy()
			inUse.Sub(want)
			return &OverCapacityError{fmt.Sprintf("device %s: %s of %s requested with %s already in use exceeds its capacity %s",
				dev.Device.Name, want.String(), name, inUse.String(), capacity.Value.String())}
		}
	}
	return nil
}

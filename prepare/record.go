package prepare

import (
	"encoding/json"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/checkpoint"
)

// Checkpoint is the checkpoint of claim records that the driver keeps.
type Checkpoint = checkpoint.Checkpoint[ClaimRecord]

// Records is what an update of the checkpoint sees (checkpoint.Records).
type Records = checkpoint.Records[ClaimRecord]

// OpenCheckpoint opens the driver's checkpoint in dir (see checkpoint.Open).
func OpenCheckpoint(dir, bootID string, onCorrupt func(kept string, err error)) (*Checkpoint, error) {
	return checkpoint.Open[ClaimRecord](dir, bootID, onCorrupt)
}

// ReadRecords reads the claim records of this boot from the checkpoint in
// stateDir, for a tool beside the agent (`carve shares`, `carve cleanup`):
// the boot is the host's under root.
func ReadRecords(root, stateDir string) (map[types.UID]ClaimRecord, error) {
	bootID, err := checkpoint.ReadBootID(root)
	if err != nil {
		return nil, err
	}
	cp, err := OpenCheckpoint(stateDir, bootID, nil)
	if err != nil {
		return nil, err
	}
	claims, err := cp.Read()
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint in %s: %w", stateDir, err)
	}
	return claims, nil
}

// ClaimState is the phase a claim's preparation reached.
type ClaimState string

const (
	// ClaimStarted is written before any preparer runs. A claim found in
	// this state after a crash is rolled back and prepared again.
	ClaimStarted ClaimState = "started"
	// ClaimCompleted is written once every device is prepared and the CDI
	// spec is on disk.
	ClaimCompleted ClaimState = "completed"
)

// ClaimRecord is everything needed to answer a repeated prepare and to undo
// a claim, whichever process prepared it.
type ClaimRecord struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	// Allocations are this driver's devices of the claim; with the
	// deterministic naming of preparers they are enough to undo a
	// claim whose preparation never completed.
	Allocations []Allocation `json:"allocations"`
	// Undo holds each preparer's undo record, by allocation index, once
	// completed.
	Undo []json.RawMessage `json:"undo,omitempty"`
	// Devices is the result returned to the kubelet.
	Devices []PreparedDevice `json:"devices,omitempty"`
	// CDISpec is the name of the claim's CDI spec file.
	CDISpec string `json:"cdiSpec,omitempty"`
	// Updated is when the record was last written.
	Updated time.Time `json:"updated"`
}

// PreparedDevice is one device's answer to the kubelet.
type PreparedDevice struct {
	Request      string     `json:"request"`
	Pool         string     `json:"pool"`
	Device       string     `json:"device"`
	ShareID      *types.UID `json:"shareID,omitempty"`
	CDIDeviceIDs []string   `json:"cdiDeviceIDs"`
	// Network is the network data reported in the claim's status.
	Network *resourceapi.NetworkDeviceData `json:"network,omitempty"`
}

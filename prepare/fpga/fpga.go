// Package fpga prepares whole FPGA cards for containers: their device nodes,
// through CDI.
package fpga

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
)

// Preparer gives a container an FPGA card's device nodes. FPGAs are
// never shared, so there is nothing on the host to create or undo.
type Preparer struct {
	// Root is the host root the device nodes are found under.
	Root string
}

var _ prepare.Preparer = Preparer{}

// Prepare checks the card's device nodes and returns the edits that give
// them to the container.
func (p Preparer) Prepare(_ context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.FPGA == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not an FPGA", a.Device)
	}
	if a.ShareID != nil {
		return prepare.Prepared{}, fmt.Errorf("FPGA %s cannot be shared", a.Device)
	}
	edits := cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "PCI_ADDRESS=" + dev.FPGA.Address,
		a.EnvPrefix() + "DEVICE_NODES=" + strings.Join(dev.FPGA.DevNodes, ","),
	}}
	for _, node := range dev.FPGA.DevNodes {
		host := filepath.Join(p.Root, node)
		if _, err := os.Stat(host); err != nil {
			return prepare.Prepared{}, fmt.Errorf("FPGA %s: device node %s: %w", a.Device, host, err)
		}
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: node, HostPath: host})
	}
	return prepare.Prepared{Edits: edits}, nil
}

// Unprepare has nothing to undo: nothing on the host was changed.
func (Preparer) Unprepare(context.Context, prepare.Allocation, json.RawMessage) error { return nil }

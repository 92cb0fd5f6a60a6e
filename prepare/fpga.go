package prepare

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/slices"
)

// FPGAPreparer gives a container an FPGA card's device nodes. FPGAs are
// never shared, so there is nothing on the host to create or undo.
type FPGAPreparer struct {
	// Root is the host root the device nodes are found under.
	Root string
}

func (p FPGAPreparer) Prepare(_ context.Context, a Allocation, dev slices.Entry) (Prepared, error) {
	if dev.FPGA == nil {
		return Prepared{}, fmt.Errorf("device %s is not an FPGA", a.Device)
	}
	if a.ShareID != nil {
		return Prepared{}, fmt.Errorf("FPGA %s cannot be shared", a.Device)
	}
	edits := cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "PCI_ADDRESS=" + dev.FPGA.Address,
		a.EnvPrefix() + "DEVICE_NODES=" + strings.Join(dev.FPGA.DevNodes, ","),
	}}
	for _, node := range dev.FPGA.DevNodes {
		host := filepath.Join(p.Root, node)
		if _, err := os.Stat(host); err != nil {
			return Prepared{}, fmt.Errorf("FPGA %s: device node %s: %w", a.Device, host, err)
		}
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: node, HostPath: host})
	}
	return Prepared{Edits: edits}, nil
}

func (FPGAPreparer) Unprepare(context.Context, Allocation, json.RawMessage) error { return nil }

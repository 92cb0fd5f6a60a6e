package fpga

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
)

// Preparer gives a container an FPGA card's device nodes. FPGAs are
// never shared, so there is nothing on the host to create or undo.
type Preparer struct {
	// Root is the host root the device nodes are looked up under (/host
	// in the chart's pod, a fixture in tests). The CDI spec names them
	// without it: the container runtime reads it on the host.
	Root string
}

var _ prepare.Preparer = Preparer{}

// Prepare checks the card's device nodes under the root and returns the
// edits that give them to the container.
func (p Preparer) Prepare(_ context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.FPGA == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not an FPGA", a.Device)
	}
	if a.ShareID != nil {
		return prepare.Prepared{}, fmt.Errorf("FPGA %s cannot be shared", a.Device)
	}
	if len(dev.FPGA.DevNodes) == 0 {
		return prepare.Prepared{}, fmt.Errorf("FPGA %s (%s): its driver (%q) made no device nodes", a.Device, dev.FPGA.Address, dev.FPGA.Driver)
	}
	edits := cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "PCI_ADDRESS=" + dev.FPGA.Address,
		a.EnvPrefix() + "DEVICE_NODES=" + strings.Join(dev.FPGA.DevNodes, ","),
	}}
	for _, node := range dev.FPGA.DevNodes {
		dn, err := p.deviceNode(node)
		if err != nil {
			return prepare.Prepared{}, fmt.Errorf("FPGA %s: %w", a.Device, err)
		}
		edits.DeviceNodes = append(edits.DeviceNodes, dn)
	}
	return prepare.Prepared{Edits: edits}, nil
}

// deviceNode looks a node up under the root and describes it by its host
// path. A character device's numbers are written out, so that the runtime
// needs no second look; anything else (a fixture's plain file) is left for
// the runtime to stat.
func (p Preparer) deviceNode(node string) (*cdispec.DeviceNode, error) {
	if !filepath.IsAbs(node) || filepath.Clean(node) != node || !strings.HasPrefix(node, "/dev/") {
		return nil, fmt.Errorf("device node %q is not a clean path under /dev", node)
	}
	under := filepath.Join(p.Root, node)
	fi, err := os.Stat(under)
	if err != nil {
		return nil, fmt.Errorf("device node %s: %w", under, err)
	}
	dn := &cdispec.DeviceNode{Path: node, HostPath: node}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode()&os.ModeCharDevice != 0 {
		dn.Type = "c"
		dn.Major, dn.Minor = int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
	}
	return dn, nil
}

// Unprepare has nothing to undo: nothing on the host was changed.
func (Preparer) Unprepare(context.Context, prepare.Allocation, json.RawMessage) error { return nil }

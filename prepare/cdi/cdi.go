// Package cdi writes the Container Device Interface spec of each prepared
// claim, checked as the CDI library checks it.
package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// cdiClass is the CDI class of carve's per-claim devices: IDs look like
// carve.dev/claim=<claim uid>-<request>-<device>.
const cdiClass = "claim"

// Writer writes one CDI spec per claim into a directory. It checks each
// spec as the CDI library does before writing one, but keeps no cache of
// the directory: the library's cache parses and keeps every spec in it when
// it is made (one per claim held, after an agent restart) and, refreshed,
// re-reads them all after each write, which is where the reference driver
// spent nearly half its CPU. carve never looks devices up in it.
type Writer struct {
	vendor string
	dir    string
}

// NewWriter writes specs of vendor (the driver name) into dir.
func NewWriter(dir, vendor string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory: %w", err)
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("CDI vendor %q: %w", vendor, err)
	}
	return &Writer{vendor: vendor, dir: dir}, nil
}

// Kind is the CDI kind of carve's devices.
func (w *Writer) Kind() string { return w.vendor + "/" + cdiClass }

// DeviceID is the fully qualified CDI name of one of a claim's devices.
func (w *Writer) DeviceID(name string) string {
	return parser.QualifiedName(w.vendor, cdiClass, name)
}

// SpecName is the file name of a claim's spec.
func (w *Writer) SpecName(claimUID string) string {
	return cdilib.GenerateTransientSpecName(w.vendor, cdiClass, claimUID) + ".json"
}

// Write writes (or replaces) a claim's spec atomically, once it is checked
// as the container runtime will check it: its version, every device's
// name and edits, no name twice, at least one device.
func (w *Writer) Write(claimUID string, devices []cdispec.Device) error {
	spec := &cdispec.Spec{Kind: w.Kind(), Devices: devices}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	if err := validate(spec); err != nil {
		return fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	// The library wrote its specs 0600 too: only the runtime (root)
	// reads them.
	if err := atomicfile.Replace(filepath.Join(w.dir, w.SpecName(claimUID)), data, 0o600); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// validate checks what the CDI library checks of a spec it writes or reads.
func validate(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return err
	}
	if len(spec.Devices) == 0 {
		return errors.New("no devices")
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return fmt.Errorf("device %q: %w", d.Name, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("device %q twice", d.Name)
		}
		seen[d.Name] = true
		if err := (&cdilib.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("device %q: %w", d.Name, err)
		}
	}
	return nil
}

// Remove deletes a claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID string) error {
	if err := os.Remove(filepath.Join(w.dir, w.SpecName(claimUID))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// DeviceName makes a string safe as a CDI device name: letters, digits,
// '-', '_' and '.', anything else replaced by '_'.
func DeviceName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}

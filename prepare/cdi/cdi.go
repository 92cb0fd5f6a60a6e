// Package cdi writes the Container Device Interface spec of each prepared
// claim, through the CDI library's cache.
package cdi

import (
	"fmt"
	"os"
	"strings"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiClass is the CDI class of carve's per-claim devices: IDs look like
// carve.dev/claim=<claim uid>-<request>-<device>.
const cdiClass = "claim"

// Writer writes one CDI spec per claim into a directory, through the CDI
// library's cache. The cache is made without auto-refresh: carve never looks
// devices up in it, and refreshing would re-read and re-parse every spec in
// the directory after each write, which is where the reference driver spent
// nearly half its CPU.
type Writer struct {
	cache  *cdilib.Cache
	vendor string
	dir    string
}

// NewWriter writes specs of vendor (the driver name) into dir.
func NewWriter(dir, vendor string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory: %w", err)
	}
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dir), cdilib.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	return &Writer{cache: cache, vendor: vendor, dir: dir}, nil
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

// Write writes (or replaces) a claim's spec atomically.
func (w *Writer) Write(claimUID string, devices []cdispec.Device) error {
	spec := &cdispec.Spec{Kind: w.Kind(), Devices: devices}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	if err := w.cache.WriteSpec(spec, w.SpecName(claimUID)); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// Remove deletes a claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID string) error {
	if err := w.cache.RemoveSpec(w.SpecName(claimUID)); err != nil {
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

package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
)

// RemoveAll removes every claim spec of vendor (the driver name) from dir,
// and what an interrupted atomic write left beside one: an uninstall's
// part. Other vendors' specs in the shared directory are left alone. It
// returns the names removed.
func RemoveAll(dir, vendor string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list CDI specs in %s: %w", dir, err)
	}
	// The name up to the claim's UID, as SpecName makes it; the temporary
	// files of atomicfile start with the target's name.
	prefix := cdilib.GenerateSpecName(vendor, cdiClass) + "_"
	var removed []string
	var errs []error
	for _, e := range entries {
		name := strings.TrimPrefix(e.Name(), ".")
		if e.IsDir() || !strings.HasPrefix(name, prefix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

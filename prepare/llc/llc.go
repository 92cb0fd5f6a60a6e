// Package llc prepares last-level caches for containers: the cache's id and
// the CPUs that share it.
package llc

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
)

// Preparer gives a container a last-level cache: its id and the CPUs
// that share it, so the workload can pin itself there. A whole-cache
// allocation needs nothing on the host. Way-partitioned shares need resctrl,
// which the slices offer only where it is mounted; their enforcement lives
// with the LLC issue, so a share is refused here rather than pretended.
type Preparer struct{}

var _ prepare.Preparer = Preparer{}

// Prepare returns the edits that describe the cache to the container.
func (Preparer) Prepare(_ context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.LLC == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not an LLC", a.Device)
	}
	if a.ShareID != nil {
		return prepare.Prepared{}, fmt.Errorf("LLC %s: way-partitioned shares are not enforced by this agent yet; allocate the cache whole", a.Device)
	}
	return prepare.Prepared{Edits: cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "CACHE_ID=" + strconv.Itoa(dev.LLC.ID),
		a.EnvPrefix() + "CPUS=" + dev.LLC.CPUs,
	}}}, nil
}

// Unprepare has nothing to undo: nothing on the host was changed.
func (Preparer) Unprepare(context.Context, prepare.Allocation, json.RawMessage) error { return nil }

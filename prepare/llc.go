package prepare

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/slices"
)

// LLCPreparer gives a container a last-level cache: its id and the CPUs
// that share it, so the workload can pin itself there. A whole-cache
// allocation needs nothing on the host. Way-partitioned shares need resctrl,
// which the slices offer only where it is mounted; their enforcement lives
// with the LLC issue, so a share is refused here rather than pretended.
type LLCPreparer struct{}

func (LLCPreparer) Prepare(_ context.Context, a Allocation, dev slices.Entry) (Prepared, error) {
	if dev.LLC == nil {
		return Prepared{}, fmt.Errorf("device %s is not an LLC", a.Device)
	}
	if a.ShareID != nil {
		return Prepared{}, fmt.Errorf("LLC %s: way-partitioned shares are not enforced by this agent yet; allocate the cache whole", a.Device)
	}
	return Prepared{Edits: cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "CACHE_ID=" + strconv.Itoa(dev.LLC.ID),
		a.EnvPrefix() + "CPUS=" + dev.LLC.CPUs,
	}}}, nil
}

func (LLCPreparer) Unprepare(context.Context, Allocation, json.RawMessage) error { return nil }

package llc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// LLC health reasons (taint values).
const (
	ReasonResctrlUnmounted = "ResctrlUnmounted"
	ReasonResctrlGroupGone = "ResctrlGroupGone"
)

// SourceResctrl is the Condition.Source of the LLC health source.
const SourceResctrl = "resctrl"

// HealthSource watches resctrl under Dir for the LLCs published shareable:
// resctrl unmounted degrades every one (its shares' ways are no longer
// held apart), a prepared share's group gone degrades its cache.
type HealthSource struct {
	// Dir is resctrl as the agent sees it.
	Dir     string
	Devices func() map[string]slices.Entry
	// Records reads the checkpoint: the prepared shares and their groups.
	Records func() (map[types.UID]prepare.ClaimRecord, error)
	// Poll is how often resctrl is looked at (2 s when 0).
	Poll time.Duration

	// shareable are the LLCs ever published with resctrl, by device: a
	// rediscovery after resctrl went finds them without it.
	shareable map[string]int
}

// groups are the resctrl groups of the prepared LLC shares, by device.
func (h *HealthSource) groups() map[string][]string {
	out := map[string][]string{}
	if h.Records == nil {
		return out
	}
	recs, err := h.Records()
	if err != nil {
		return out
	}
	for _, r := range recs {
		if r.State != prepare.ClaimCompleted {
			continue
		}
		for i, a := range r.Allocations {
			if a.Kind != names.KindLLC || a.ShareID == nil || i >= len(r.Undo) {
				continue
			}
			var s share
			if json.Unmarshal(r.Undo[i], &s) == nil && s.Group != "" {
				out[a.Device] = append(out[a.Device], s.Group)
			}
		}
	}
	return out
}

// Check looks at resctrl once. It is not safe for concurrent use.
func (h *HealthSource) Check(sink health.Sink) {
	_, err := os.Stat(filepath.Join(h.Dir, "info/L3"))
	mounted := err == nil
	var groups map[string][]string
	if h.shareable == nil {
		h.shareable = map[string]int{}
	}
	devices := h.Devices()
	for name, e := range devices {
		if e.LLC != nil && e.LLC.Resctrl != nil {
			h.shareable[name] = e.LLC.ID
		}
	}
	for name, id := range h.shareable {
		if _, ok := devices[name]; !ok {
			delete(h.shareable, name)
			continue
		}
		c := health.Condition{Device: name, Source: SourceResctrl}
		if !mounted {
			c.Severity, c.Reason, c.Message = health.Degraded, ReasonResctrlUnmounted, fmt.Sprintf("LLC %d: resctrl is not mounted at %s", id, h.Dir)
			sink.Observe(c)
			continue
		}
		if groups == nil {
			groups = h.groups()
		}
		for _, g := range groups[name] {
			if _, err := os.Stat(filepath.Join(h.Dir, g)); os.IsNotExist(err) {
				c.Severity, c.Reason, c.Message = health.Degraded, ReasonResctrlGroupGone, fmt.Sprintf("LLC %d: resctrl group %s of a prepared share is gone", id, g)
				break
			}
		}
		sink.Observe(c)
	}
}

// Run checks every Poll until ctx is done.
func (h *HealthSource) Run(ctx context.Context, sink health.Sink) error {
	every := h.Poll
	if every <= 0 {
		every = 2 * time.Second
	}
	wait.UntilWithContext(ctx, func(context.Context) { h.Check(sink) }, every)
	return nil
}

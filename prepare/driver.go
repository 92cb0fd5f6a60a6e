package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/prepare/status"
	"github.com/carve-dra/carve/slices"
)

// Options configure a Driver.
type Options struct {
	DriverName string
	// StateDir holds the checkpoint and the per-claim info files. It must be
	// the same path on the host and in the agent's container, since CDI
	// mounts name host paths.
	StateDir   string
	Checkpoint *Checkpoint
	CDI        *cdi.Writer
	// Preparers by device kind.
	Preparers map[string]Preparer
	// Devices returns the currently published devices by name.
	Devices func() map[string]slices.Entry
	Metrics *Metrics
	// StatusClient, when set, is used to report network devices in the
	// claims' status.devices.
	StatusClient status.Writer
	// Health reports device health to the kubelet; nil means not supported.
	Health func(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error
	// ConflictWait is how long a prepare whose device is still held by
	// another claim's record (an unshared device, or a share over the
	// device's capacity) waits for that record to go before it fails: the
	// scheduler gives a device to a new claim as soon as the old claim's
	// allocation is gone from the API server, and the kubelet unprepares
	// the old claim on its own time, often just after. A failed prepare
	// costs the pod the kubelet's retry backoff (74 s was measured on the
	// local node). Zero fails at once.
	ConflictWait time.Duration
	// Fatal is called with errors the helper reports as unrecoverable; the
	// agent cancels its context there. Never called from a goroutine to
	// exit the process itself.
	Fatal func(err error)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	opts Options
	// locks keep the preparation of a claim and its unpreparation from
	// overlapping within this process, while other claims go on; the
	// checkpoint's flock covers other processes.
	locks claimLocks
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// NewDriver checks the options and returns the plugin.
func NewDriver(opts Options) (*Driver, error) {
	if opts.DriverName == "" || opts.Checkpoint == nil || opts.CDI == nil || opts.Devices == nil || opts.StateDir == "" {
		return nil, errors.New("prepare: driver name, state dir, checkpoint, CDI writer and device source are required")
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if err := EnsureStateDir(opts.StateDir); err != nil {
		return nil, err
	}
	if err := PrivateDir(filepath.Join(opts.StateDir, "claims")); err != nil {
		return nil, fmt.Errorf("create claim info directory: %w", err)
	}
	recs, err := opts.Checkpoint.Read()
	if err != nil {
		return nil, err
	}
	opts.Metrics.PreparedClaims.Set(float64(countCompleted(maps.All(recs))))
	removeStaleClaimFiles(opts.StateDir, recs)
	for kind, p := range opts.Preparers {
		r, ok := p.(Restorer)
		if !ok {
			continue
		}
		var allocs []Allocation
		var undo []json.RawMessage
		for _, rec := range recs {
			// Started claims too (with no undo yet): what they
			// made is still theirs until they are rolled back.
			for i, a := range rec.Allocations {
				if a.Kind != kind {
					continue
				}
				var u json.RawMessage
				if i < len(rec.Undo) {
					u = rec.Undo[i]
				}
				allocs, undo = append(allocs, a), append(undo, u)
			}
		}
		r.Restore(allocs, undo)
	}
	return &Driver{opts: opts}, nil
}

// HandleError is called by the helper for background errors, such as a
// failed publish. Recoverable ones are logged and counted; fatal ones stop
// the agent through its context, never by exiting from a goroutine.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.opts.Metrics.PublishErrors.Inc()
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.opts.Fatal != nil {
		d.opts.Fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus streams device health where the agent can observe it.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.opts.Health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.opts.Health(ctx, reports)
}

// stateDirMode is the state directory's: others may pass through it,
// never list or read it. A claim's MPS server runs as the claim's pod's
// user (the root control daemon setuids to the client's UID) and opens its
// daemon's pipe directory, below the state directory, by its host path:
// at 0700 a non-root pod got no server (bottlerocket-os/bottlerocket#4673
// traced the same through a 0700 /run/nvidia). What it holds stays the
// agent's: the checkpoint is 0600, and the directories of claim files,
// netdev records and the hook binary's lock are 0700 (PrivateDir).
const stateDirMode = 0o711

// EnsureStateDir creates the state directory, or sets an existing one, to
// stateDirMode: a hostPath volume creates it 0755, and earlier agents made
// it 0700.
func EnsureStateDir(dir string) error {
	if err := os.MkdirAll(dir, stateDirMode); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	if err := os.Chmod(dir, stateDirMode); err != nil { //nolint:gosec // G302 wants 0600 of files; a directory needs x to be entered
		return fmt.Errorf("set the mode of state directory %s: %w", dir, err)
	}
	return nil
}

// PrivateDir creates a directory of the state directory's that only the
// agent and the container runtime (root) may enter, or tightens an
// existing one to 0700 (earlier agents made them 0755 inside a 0700 state
// directory). Claim files inside stay 0644: containers read them through
// bind mounts, which need no path to them.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { //nolint:gosec // G302 wants 0600 of files; a directory needs x to be entered
		return fmt.Errorf("restrict %s: %w", dir, err)
	}
	return nil
}

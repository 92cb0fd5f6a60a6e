// Package gpuopen opens a node's NVML for carve's commands: the host's
// library below the driver root, or a replay file through go-nvml's mock.
package gpuopen

import (
	"context"
	"errors"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
)

// Options says which NVML to open.
type Options struct {
	// Replay, when set, is a replay file answered instead of the library.
	Replay string
	// ReplayProcesses, with Replay, is the file the replay answers its
	// GPUs' processes from (nvmlreplay.ProcessesFile).
	ReplayProcesses string
	// DriverRoot is where the host's libnvidia-ml.so.1 is looked for.
	DriverRoot string
	Timeout    time.Duration
}

// Open opens NVML. A host without the library, a library that fails to
// initialise or hangs gives a nil session and the reason, logged once; the
// caller goes on without GPUs. A replay file that cannot be read is an
// error: the user asked for it.
func Open(ctx context.Context, opts Options) (*gpu.Session, error, error) {
	logger := klog.FromContext(ctx)
	lib := gpu.RealLibrary(opts.DriverRoot)
	if opts.Replay != "" {
		r, err := nvmlreplay.Load(opts.Replay)
		if err != nil {
			return nil, nil, err
		}
		for _, w := range r.Warnings {
			logger.Info("Warning: NVML replay", "file", opts.Replay, "warning", w)
		}
		if opts.ReplayProcesses != "" {
			r.ProcessesFrom(opts.ReplayProcesses)
		}
		lib = r.Library()
	}
	start := time.Now()
	s, err := gpu.Open(ctx, lib, opts.Timeout)
	switch {
	case err == nil:
		logger.V(2).Info("NVML opened", "replay", opts.Replay, "duration", time.Since(start))
		return s, nil, nil
	case errors.Is(err, gpu.ErrNoNVML):
		logger.V(1).Info("No NVML library; GPUs are not published", "driverRoot", opts.DriverRoot)
	default:
		logger.Error(err, "NVML unavailable; going on without GPUs")
	}
	return nil, err, nil
}

// Inventory is discovery's NVML source: the session's inventory, or the
// reason there is none.
func Inventory(s *gpu.Session, reason error) func(context.Context) (*nvmlinfo.Inventory, error) {
	return func(ctx context.Context) (*nvmlinfo.Inventory, error) {
		if s == nil {
			return nil, reason
		}
		return s.Inventory(ctx)
	}
}

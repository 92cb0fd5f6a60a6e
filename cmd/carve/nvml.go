package main

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/gpuopen"
)

// nvmlFlags say which NVML discover and snapshot ask.
type nvmlFlags struct {
	replay, driverRoot string
	timeout            time.Duration
	// off: a snapshot of a node without NVML; do not ask this host's.
	off bool
}

func (n *nvmlFlags) add(fs *pflag.FlagSet, replay bool) {
	if replay {
		fs.StringVar(&n.replay, "nvml-replay", "", "answer NVML from this JSON inventory (format: go doc ./discovery/nvmlinfo) instead of the library")
	}
	fs.StringVar(&n.driverRoot, "nvidia-driver-root", "/", "where the NVIDIA driver is installed (libnvidia-ml.so.1 is looked for below it), below --root")
	fs.DurationVar(&n.timeout, "nvml-timeout", gpu.DefaultTimeout, "bound on every NVML call")
}

var errNoNVMLInSnapshot = errors.New("the snapshot holds no NVML inventory")

// open opens NVML; a host without it gives a nil session and the reason.
func (n *nvmlFlags) open(ctx context.Context, root string) (*gpu.Session, error, error) {
	if n.off {
		return nil, errNoNVMLInSnapshot, nil
	}
	driverRoot := n.driverRoot
	if n.replay == "" && root != "" && root != "/" {
		driverRoot = filepath.Join(root, n.driverRoot)
	}
	return gpuopen.Open(ctx, gpuopen.Options{Replay: n.replay, DriverRoot: driverRoot, Timeout: n.timeout})
}

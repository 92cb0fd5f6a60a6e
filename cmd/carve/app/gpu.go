package app

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/gpuopen"
	"github.com/carve-dra/carve/gpu/prep"
)

// gpus is the node's NVML, opened once, and the GPU preparer over it. A node
// without NVML still runs: its GPUs are not published and GPU claims are
// refused, saying why.
type gpus struct {
	session *gpu.Session
	reason  error
	prep    *prep.Preparer
	memory  *gpuMemory
}

func openGPUs(ctx context.Context, opts Options, hook hookBinary) (*gpus, error) {
	s, reason, err := gpuopen.Open(ctx, gpuopen.Options{Replay: opts.NVMLReplay, ReplayProcesses: opts.NVMLReplayProcesses, DriverRoot: driverRoot(opts), Timeout: opts.NVMLTimeout})
	if err != nil {
		return nil, err
	}
	mem := openGPUMemory(ctx, opts, s, hook)
	return &gpus{session: s, reason: reason, memory: mem, prep: prep.New(prep.Options{
		NVML: s, Root: opts.Root, DriverRoot: opts.NVIDIADriverRoot, CDIHookPath: opts.NVIDIACDIHook,
		Shares: mem.shares, StateDir: opts.StateDir, Logger: klog.FromContext(ctx).WithName("gpu"),
	})}, nil
}

// driverRoot is the driver root as the agent sees it: below Root.
func driverRoot(opts Options) string {
	r := opts.NVIDIADriverRoot
	if r == "" {
		r = "/"
	}
	if opts.Root == "" || opts.Root == "/" {
		return r
	}
	return opts.Root + r
}

func (g *gpus) close(ctx context.Context) {
	if g.session != nil {
		g.session.Close(ctx)
	}
}

package discovery

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/gpu/nvmlinfo"
)

// Options says where and what to discover.
type Options struct {
	// Root is the host root: "/" in production, a fixture tree in tests.
	Root string
	// CPUCacheRoot, when set, is read for the CPU cache tree
	// (sys/devices/system/cpu/cpu*/cache) and resctrl instead of Root,
	// while everything else stays under Root. It lets a node describe an
	// L3 from a fixture where its sysfs has none (some VMs), and lets
	// tests make the agent blind to the host's caches.
	CPUCacheRoot string
	// FPGARoot, when set, is read for FPGA cards (their PCI functions,
	// sysfs device trees and /dev nodes) instead of Root. It lets a test
	// give a real node a fixture card.
	FPGARoot string
	Net      NetFilter
	// NVML, when set, reports the GPUs (package gpu). Its failure costs
	// the node its GPUs, never the discovery.
	NVML func(context.Context) (*nvmlinfo.Inventory, error)
	// KernelProbe, when set, tries what the running kernel offers (see
	// package netdev/kprobe). It is asked only where Root's procfs is the
	// running kernel's (same boot id): under a snapshot or a fixture the
	// kernel described is another, and its configuration is read instead,
	// as it is where the probe fails. Probes should cache their answer:
	// discovery runs on every link event.
	KernelProbe func(context.Context) (KernelFeatures, error)
}

// Discover reads the node's hardware under opts.Root. Missing optional files
// give fewer attributes; a malformed file is an error that names it.
func Discover(ctx context.Context, opts Options) (*Inventory, error) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	root := opts.Root
	if root == "" {
		root = "/"
	}
	t := tree{root: root}

	pci, err := t.listPCI(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover PCI functions: %w", err)
	}
	inv := &Inventory{}
	if inv.NICs, err = t.listNICs(opts.Net, pci); err != nil {
		return nil, fmt.Errorf("discover NICs: %w", err)
	}
	cacheTree := t
	if opts.CPUCacheRoot != "" {
		cacheTree = tree{root: opts.CPUCacheRoot}
	}
	if inv.LLCs, err = cacheTree.listLLCs(); err != nil {
		return nil, fmt.Errorf("discover LLCs: %w", err)
	}
	fns := sortedPCI(pci)
	fpgaTree, fpgaFns := t, fns
	if opts.FPGARoot != "" {
		fpgaTree = tree{root: opts.FPGARoot}
		fpgaPCI, err := fpgaTree.listPCI(ctx)
		if err != nil {
			return nil, fmt.Errorf("discover FPGAs under %s: %w", opts.FPGARoot, err)
		}
		fpgaFns = sortedPCI(fpgaPCI)
	}
	inv.FPGAs = fpgaTree.listFPGAs(fpgaFns)
	for _, f := range fns {
		if isNVIDIAGPU(f) {
			inv.GPUs = append(inv.GPUs, GPU{PCIFunction: f})
		}
	}
	if inv.Kernel, err = t.kernelFeatures(ctx, opts.KernelProbe); err != nil {
		return nil, fmt.Errorf("discover kernel features: %w", err)
	}
	if opts.NVML != nil {
		if inv.NVML, err = opts.NVML(ctx); err != nil {
			inv.NVML, inv.NVMLError = nil, err.Error()
			logger.V(2).Info("GPUs left out: NVML did not answer", "err", err)
		}
	}
	logger.V(2).Info("Discovered hardware", "root", root, "nics", len(inv.NICs), "llcs", len(inv.LLCs),
		"fpgas", len(inv.FPGAs), "gpus", len(inv.GPUs), "duration", time.Since(start))
	return inv, nil
}

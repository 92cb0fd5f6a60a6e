package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/cmd/carve/app"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/snapshot"
	"github.com/carve-dra/carve/gpu/gpuopen"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/netdev/kernelprobe"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

type discoverFlags struct {
	root, cpuCacheRoot, fpgaRoot, nodeName, configFile, output string
	nvml                                                       nvmlFlags
	from                                                       string
}

func newDiscoverCommand() *cobra.Command {
	var f discoverFlags
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "print this node's ResourceSlices as a v1 List",
		Args:  noArgs,
		RunE: work(func(cmd *cobra.Command) error {
			return runDiscover(cmd.Context(), f, cmd.OutOrStdout())
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.root, "root", "/", "host root to read sysfs and procfs under")
	fs.StringVar(&f.fpgaRoot, "fpga-root", "", "root to read FPGA cards (PCI functions of class 0x12, their sysfs trees and /dev nodes) under instead of --root")
	fs.StringVar(&f.cpuCacheRoot, "cpu-cache-root", "", "root to read the CPU cache tree (sys/devices/system/cpu, sys/fs/resctrl) under instead of --root")
	fs.StringVar(&f.nodeName, "node-name", defaultNodeName(), "node the slices are for: $NODE_NAME when set, else the hostname")
	fs.StringVar(&f.configFile, "config", "", "NodeConfig file (carve.dev/v1alpha1)")
	fs.StringVarP(&f.output, "output", "o", "yaml", "output format: yaml or json")
	// The flag was long named "o" before it was "output": --o still works.
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "o" {
			name = "output"
		}
		return pflag.NormalizedName(name)
	})
	f.nvml.add(fs, true)
	fs.StringVar(&f.from, "from", "", "discover the node a snapshot (carve snapshot) captured, instead of this one")
	cmd.MarkFlagsMutuallyExclusive("from", "root")
	cmd.MarkFlagsMutuallyExclusive("from", "nvml-replay")
	must(cmd.MarkFlagFilename("config", "yaml", "yml"))
	must(cmd.MarkFlagFilename("from", "tar.gz"))
	must(cmd.MarkFlagDirname("root"))
	must(cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"yaml", "json"}, cobra.ShellCompDirectiveNoFileComp)))
	return cmd
}

func runDiscover(ctx context.Context, f discoverFlags, stdout io.Writer) error {
	relaxGC()
	if f.nodeName == "" {
		return fmt.Errorf("--node-name is empty and the hostname is unknown")
	}
	if f.from != "" {
		dir, err := os.MkdirTemp("", "carve-from-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }() // a temporary directory: at worst left behind
		u, err := snapshot.Unpack(f.from, dir)
		if err != nil {
			return err
		}
		f.root, f.nvml.replay = u.Root, u.NVMLReplay
		if f.configFile == "" {
			f.configFile = u.NodeConfig
		}
		if u.NVMLReplay == "" {
			f.nvml.off = true
		}
	}
	cfg, err := nodeconfig.Load(f.configFile)
	if err != nil {
		return err
	}
	session, reason, err := f.nvml.open(ctx, f.root)
	if err != nil {
		return err
	}
	if session != nil {
		defer session.Close(ctx)
	}
	inv, err := discovery.Discover(ctx, discovery.Options{Root: f.root, CPUCacheRoot: f.cpuCacheRoot, FPGARoot: f.fpgaRoot, Net: netFilter(cfg),
		NVML: gpuopen.Inventory(session, reason), KernelProbe: (&kernelprobe.Prober{Root: f.root}).Probe})
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	// Each GPU's memoryEnforcement as the agent would choose it here (the
	// agent's pod sees the host below its --root).
	if inv.NVML != nil {
		inv.GPUMemory = memslice.Tiers(inv.NVML, memslice.EnvBelow(f.root, f.nvml.driverRoot))
		for uuid, m := range inv.GPUMemory {
			logger.Info("GPU memory enforcement", "gpu", uuid, "tier", m.Enforcement, "reason", m.Reason)
		}
	}
	res := slices.Build(inv, cfg, f.nodeName)
	for _, n := range res.Notices {
		logger.Info("Notice", "msg", n)
	}
	published, unhealthy := app.WithHealth(cfg, f.nodeName, f.root, res)
	for name, s := range unhealthy {
		logger.Info("Device unhealthy; published with a taint", "device", name, "severity", s.Severity, "reason", s.Reason, "message", s.Message)
	}
	out, err := slices.Encode(slices.Objects(cfg.DriverName, f.nodeName, published), f.output)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func netFilter(cfg *nodeconfig.NodeConfig) discovery.NetFilter {
	return discovery.NetFilter{Include: cfg.Netdev.Include, Exclude: cfg.Netdev.Exclude, IncludeVirtual: cfg.Netdev.IncludeVirtual}
}

func defaultNodeName() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// relaxGC stops the garbage collector until the heap nears 256 MiB, unless
// GOGC or GOMEMLIMIT say otherwise: discover runs once and exits, and on a
// large node (thousands of netdevs) it allocates some tens of MB, which the
// collector otherwise walks several times (a fifth of its CPU time).
func relaxGC() {
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(256 << 20)
		debug.SetGCPercent(-1)
	}
}

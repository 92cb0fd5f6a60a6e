package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func runDiscover(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("discover", flag.ContinueOnError)
	root := fs.String("root", "/", "host root to read sysfs and procfs under")
	cpuCacheRoot := fs.String("cpu-cache-root", "", "root to read the CPU cache tree (sys/devices/system/cpu, sys/fs/resctrl) under instead of --root")
	nodeName := fs.String("node-name", defaultNodeName(), "node the slices are for (default: $NODE_NAME, else the hostname)")
	configFile := fs.String("config", "", "NodeConfig file (carve.dev/v1alpha1)")
	output := fs.String("o", "yaml", "output format: yaml or json")
	ctx = withLogging(ctx, fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *nodeName == "" {
		return fmt.Errorf("--node-name is empty and the hostname is unknown")
	}
	cfg, err := nodeconfig.Load(*configFile)
	if err != nil {
		return err
	}
	inv, err := discovery.Discover(ctx, discovery.Options{Root: *root, CPUCacheRoot: *cpuCacheRoot, Net: netFilter(cfg)})
	if err != nil {
		return err
	}
	res := slices.Build(inv, cfg, *nodeName)
	logger := klog.FromContext(ctx)
	for _, n := range res.Notices {
		logger.Info("Notice", "msg", n)
	}
	out, err := slices.Encode(slices.Objects(cfg.DriverName, *nodeName, res.Resources), *output)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
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

package discovery

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
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

// Discover reads the node's hardware under opts.Root, as the first scan of a
// new Scanner. Missing optional files give fewer attributes; a malformed
// file is an error that names it.
func Discover(ctx context.Context, opts Options) (*Inventory, error) {
	return NewScanner(opts).Scan(ctx, AnyChange())
}

// Scanner discovers one node again and again, reading again only what can
// have changed since its last scan: the agent rescans on every link event
// and every minute, and a large node has thousands of PCI functions and
// netdevs. What it keeps is checked on every scan against what cannot
// change unseen (see scanPCI and readNetdevs), so a scan reports what a
// first discovery would. It is safe for concurrent use; scans run one at a
// time.
type Scanner struct {
	opts Options
	mu   sync.Mutex
	// What the last successful scan read, for the next.
	pci, fpgaPCI *pciScan
	netdevs      *netdevScan
	kernelConfig kernelConfigCache
}

// NewScanner returns a Scanner of the node opts describe.
func NewScanner(opts Options) *Scanner {
	if opts.Root == "" {
		opts.Root = "/"
	}
	return &Scanner{opts: opts}
}

// Changes says what may have changed since a Scanner's last scan.
type Changes struct {
	// links are the netdevs to read again; nil means all of them.
	links map[string]bool
}

// AnyChange reads every netdev again: a periodic rescan, or link events
// that may have been lost.
func AnyChange() Changes { return Changes{} }

// LinksChanged reads again only the netdevs netlink reported changed
// (besides those that appeared or were made again, which a scan finds
// itself). PCI functions and kernel features are checked as on every scan.
func LinksChanged(names ...string) Changes {
	c := Changes{links: make(map[string]bool, len(names))}
	for _, n := range names {
		c.links[n] = true
	}
	return c
}

func (c Changes) rereads(name string) bool { return c.links == nil || c.links[name] }

// Scan discovers the node; changes says which netdevs to read again.
func (s *Scanner) Scan(ctx context.Context, changes Changes) (*Inventory, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	logger := klog.FromContext(ctx)
	opts := s.opts
	start := time.Now()
	t := tree{root: opts.Root}

	pci, pciChanged, err := t.scanPCI(ctx, s.pci)
	if err != nil {
		return nil, fmt.Errorf("discover PCI functions: %w", err)
	}
	netdevs, err := t.readNetdevs(opts.Net, pci, s.netdevs, changes)
	if err != nil {
		return nil, fmt.Errorf("discover NICs: %w", err)
	}
	cacheTree := t
	if opts.CPUCacheRoot != "" {
		cacheTree = tree{root: opts.CPUCacheRoot}
	}
	inv := &Inventory{}
	if inv.LLCs, err = cacheTree.listLLCs(); err != nil {
		return nil, fmt.Errorf("discover LLCs: %w", err)
	}
	// The inventory's own copy: the scan kept is never handed out.
	fns := slices.Clone(pci.fns)
	inv.NICs = netdevs.nics(pci, fns)
	fpgaTree, fpgaPCI := t, pci
	if opts.FPGARoot != "" {
		fpgaTree = tree{root: opts.FPGARoot}
		if fpgaPCI, _, err = fpgaTree.scanPCI(ctx, s.fpgaPCI); err != nil {
			return nil, fmt.Errorf("discover FPGAs under %s: %w", opts.FPGARoot, err)
		}
	}
	inv.FPGAs = fpgaTree.listFPGAs(fpgaPCI.fns)
	for _, f := range fns {
		if isNVIDIAGPU(f) {
			inv.GPUs = append(inv.GPUs, GPU{PCIFunction: f})
		}
	}
	if inv.Kernel, err = t.kernelFeatures(ctx, opts.KernelProbe, &s.kernelConfig); err != nil {
		return nil, fmt.Errorf("discover kernel features: %w", err)
	}
	if opts.NVML != nil {
		if inv.NVML, err = opts.NVML(ctx); err != nil {
			inv.NVML, inv.NVMLError = nil, err.Error()
			logger.V(2).Info("GPUs left out: NVML did not answer", "err", err)
		}
	}
	s.pci, s.netdevs = pci, netdevs
	if opts.FPGARoot != "" {
		s.fpgaPCI = fpgaPCI
	}
	logger.V(2).Info("Discovered hardware", "root", opts.Root, "nics", len(inv.NICs), "llcs", len(inv.LLCs),
		"fpgas", len(inv.FPGAs), "gpus", len(inv.GPUs), "pciChanged", pciChanged, "netdevsRead", netdevs.fresh,
		"duration", time.Since(start))
	return inv, nil
}

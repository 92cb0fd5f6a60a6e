package app

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// inventory holds the latest discovery and what it publishes.
type inventory struct {
	root         string
	cpuCacheRoot string
	fpgaRoot     string
	cfg          *nodeconfig.NodeConfig
	node         string
	// build are the slices' options beside the node config: the loaded
	// classifier's room for shares.
	build   []slices.Option
	metrics *prepare.Metrics
	nvml    func(context.Context) (*nvmlinfo.Inventory, error)
	// gpuMemory gives each GPU's memory enforcement tier.
	gpuMemory func(context.Context, *nvmlinfo.Inventory) map[string]discovery.GPUMemory
	// kernel probes the running kernel's features once (see
	// discovery.Options.KernelProbe).
	kernel func(context.Context) (discovery.KernelFeatures, error)
	// scanner is made at the first rescan and kept: it reads again only
	// what can have changed.
	scanner *discovery.Scanner
	// found is what the last rescan found, its slices current.
	found   *discovery.Inventory
	current atomic.Pointer[slices.Result]
	// health subscribers are woken after each rescan that found
	// something new.
	mu      sync.Mutex
	waiters []chan struct{}
	// health, when set, is told what each rescan found.
	health *deviceHealth
}

// rescan discovers the hardware again, reading again what changes says
// may have changed, and reports whether what is published changed.
func (i *inventory) rescan(ctx context.Context, changes discovery.Changes) (bool, error) {
	start := time.Now()
	if i.scanner == nil {
		i.scanner = discovery.NewScanner(discovery.Options{Root: i.root, CPUCacheRoot: i.cpuCacheRoot, FPGARoot: i.fpgaRoot, Net: discovery.NetFilter{
			Include: i.cfg.Netdev.Include, Exclude: i.cfg.Netdev.Exclude, IncludeVirtual: i.cfg.Netdev.IncludeVirtual,
		}, NVML: i.nvml, KernelProbe: i.kernel})
	}
	inv, err := i.scanner.Scan(ctx, changes)
	i.metrics.DiscoveryDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return false, err
	}
	if i.gpuMemory != nil {
		inv.GPUMemory = i.gpuMemory(ctx, inv.NVML)
	}
	// The slices are a function of the inventory and the node config,
	// which does not change: where discovery found what it found last,
	// they are what was built last. Comparing inventories takes about a
	// millisecond on a large node; building the slices and comparing them
	// (reflect.DeepEqual of thousands of devices) about a hundred.
	if i.found != nil && reflect.DeepEqual(i.found, inv) {
		return false, nil
	}
	i.found = inv
	res := slices.Build(inv, i.cfg, i.node, i.build...)
	old := i.current.Swap(&res)
	if i.health != nil {
		var before map[string]slices.Entry
		if old != nil {
			before = old.Index
		}
		i.health.rescanned(before, res.Index)
	}
	i.wake()
	if old == nil {
		for _, n := range res.Notices {
			klog.FromContext(ctx).Info("Not offered in full", "reason", n)
		}
		return true, nil
	}
	return !reflect.DeepEqual(old.Resources, res.Resources), nil
}

// rebuild builds the pool again from what the last rescan found: after
// the driver has read the checkpoint, which tells which GPU instances are
// claims' (slices.MIGOwned).
func (i *inventory) rebuild() {
	if i.found == nil {
		return
	}
	res := slices.Build(i.found, i.cfg, i.node, i.build...)
	i.current.Store(&res)
}

func (i *inventory) devices() map[string]slices.Entry { return i.current.Load().Index }

func (i *inventory) resources() resourceslice.DriverResources { return i.current.Load().Resources }

// subscribe returns a channel woken after each rescan that found
// something new, and its cancel.
func (i *inventory) subscribe() (<-chan struct{}, func()) {
	wake := make(chan struct{}, 1)
	i.mu.Lock()
	i.waiters = append(i.waiters, wake)
	i.mu.Unlock()
	return wake, func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		for n, w := range i.waiters {
			if w == wake {
				i.waiters = append(i.waiters[:n], i.waiters[n+1:]...)
				break
			}
		}
	}
}

// wake wakes the subscribers.
func (i *inventory) wake() {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, w := range i.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

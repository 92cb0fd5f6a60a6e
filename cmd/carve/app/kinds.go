package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/netdev/addrbook"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/atomicfile"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// kinds is every device kind's preparer, with what the NIC kind needs
// beside it (the node's network namespace, its link events and the BPF
// classifier) and what the GPU kinds need (the node's NVML).
type kinds struct {
	preparers  map[string]prepare.Preparer
	nics       *netdev.NICPreparer
	linkEvents *netdev.LinkChanges
	// classifierShares is how many shares the loaded classifier holds;
	// 0 where none is loaded.
	classifierShares int
	collectors       []prometheus.Collector
	gpus             *gpus
	close            func()
}

// openKinds wires the preparer of each device kind. A node without BPF
// still serves every kind; its bandwidth shares are refused at prepare.
func openKinds(ctx context.Context, opts Options, bootID string) (*kinds, error) {
	logger := klog.FromContext(ctx)
	hostNS, err := openHostNetns(opts.Root, opts.HostNetns)
	if err != nil {
		return nil, err
	}
	closers := []func(){func() { hostNS.Close() }}
	k := &kinds{close: func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}}
	if k.linkEvents, err = netdev.WatchLinks(ctx, hostNS); err != nil {
		logger.Error(err, "No link events; relying on the periodic rescan")
	}
	var shaper *bpf.Shaper
	err = errors.New("the kernel is older than carve's minimum")
	if !opts.NoClassifier {
		shaper, err = openShaper(opts.BPFPinDir)
	}
	if err != nil {
		logger.Error(err, "BPF classifier unavailable; bandwidth shares will be refused")
	} else {
		closers = append(closers, func() { shaper.Close() })
		k.classifierShares = shaper.ShareSlots()
		if removed, err := bpf.CleanupDefunct(opts.BPFPinDir); err != nil {
			logger.Error(err, "Cleaning up defunct classifier links")
		} else if len(removed) > 0 {
			logger.Info("Removed classifier links whose network namespace is gone", "links", removed)
		}
	}
	hook, err := installHookBinary(opts.StateDir)
	if err != nil {
		k.close()
		return nil, err
	}
	book := addressBook(ctx, opts)
	nics, err := netdev.NewNICPreparer(netdev.Options{HostNS: hostNS, StateDir: opts.StateDir, HookPath: hook.path, HookArgs: hook.argv("netns-attach"), Config: opts.Config, Shaper: shaper, PinDir: opts.BPFPinDir, BootID: bootID, Addresses: book})
	if err != nil {
		k.close()
		return nil, err
	}
	if k.gpus, err = openGPUs(ctx, opts, hook); err != nil {
		k.close()
		return nil, err
	}
	closers = append(closers, func() { k.gpus.close(ctx) })
	k.nics = nics
	k.collectors = []prometheus.Collector{nics}
	if k.gpus.memory.police != nil {
		k.collectors = append(k.collectors, k.gpus.memory.police)
	}
	k.preparers = map[string]prepare.Preparer{
		names.KindNIC:  nics,
		names.KindFPGA: fpga.Preparer{Root: firstSet(opts.FPGARoot, opts.Root)},
		names.KindLLC:  llcPreparer(ctx, opts, hook),
		names.KindGPU:  k.gpus.prep,
		names.KindMIG:  k.gpus.prep,
	}
	return k, nil
}

// addressBook records the addresses of cluster-wide pools in the API
// server, in the agent's namespace (its DaemonSet's), and sweeps the
// records of gone holders while the agent runs; nil without an API server
// or namespace (such pools then refuse shares, saying why).
func addressBook(ctx context.Context, opts Options) *addrbook.Book {
	if opts.KubeClient == nil || opts.DaemonSet.Namespace == "" {
		return nil
	}
	b := addrbook.New(addrbook.Options{Client: opts.KubeClient, Namespace: opts.DaemonSet.Namespace, Node: opts.NodeName})
	if opts.Config != nil && slices.ContainsFunc(opts.Config.Netdev.Pools, nodeconfig.AddressPool.ClusterWide) {
		go b.Run(ctx)
		// Prepares read what other nodes hold from a watch, not a
		// List each; until it has listed, and without it, they list.
		if err := b.Watch(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Watching the pool address records; prepares list them instead")
		}
	}
	return b
}

// llcPreparer prepares LLC shares through resctrl under the root the
// caches are read from, where it is mounted; the hook writes to the same
// directory as the host sees it.
func llcPreparer(ctx context.Context, opts Options, hook hookBinary) *llc.Preparer {
	cacheRoot := firstSet(opts.CPUCacheRoot, opts.Root)
	dir := resctrl.HostDir(cacheRoot)
	if _, err := resctrl.ReadL3Info(dir); err != nil {
		klog.FromContext(ctx).V(1).Info("No resctrl L3 allocation; LLCs are prepared whole only", "dir", dir, "reason", err)
		return llc.New(llc.Options{HookPath: hook.path, HookArgs: hook.argv("resctrl-attach")})
	}
	hostDir := string(dir)
	if rel, err := filepath.Rel(firstSet(opts.Root), string(dir)); err == nil && !strings.HasPrefix(rel, "..") {
		hostDir = filepath.Join("/", rel)
	}
	return llc.New(llc.Options{FS: dir, HostDir: hostDir, HookPath: hook.path, HookArgs: hook.argv("resctrl-attach"), StateDir: opts.StateDir})
}

func firstSet(paths ...string) string {
	for _, p := range paths {
		if p != "" {
			return p
		}
	}
	return "/"
}

// openHostNetns opens the node's network namespace: the one given, else
// that of the host's init process under root, else the agent's own (an agent
// run on the host against a fixture root).
func openHostNetns(root, path string) (netns.NsHandle, error) {
	if path == "" {
		candidate := filepath.Join(root, "proc/1/ns/net")
		if _, err := os.Stat(candidate); err != nil {
			return netns.Get()
		}
		path = candidate
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), fmt.Errorf("node network namespace %s: %w", path, err)
	}
	return ns, nil
}

// openShaper mounts bpffs where it is missing and opens the pinned
// classifier. The pins only outlive the agent's container when the pin
// directory is on the host's bpffs (the chart mounts /sys/fs/bpf).
func openShaper(pinDir string) (*bpf.Shaper, error) {
	if err := bpf.MountBPFFS(filepath.Dir(pinDir)); err != nil {
		return nil, err
	}
	s, err := bpf.OpenShaper(pinDir)
	if err != nil {
		return nil, err
	}
	if err := s.PreloadPodGuards(podGuardPool, podGuardQuiet); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// The pod guards the agent keeps loaded ahead of the prepares that take
// them (bpf/guardpool.go): enough for a node's usual arrivals, each a few
// kilobytes of kernel memory. The pool fills once no prepare has asked for
// a guard for about one prepare's length, so a burst's prepares do not
// wait behind it.
const (
	podGuardPool  = 16
	podGuardQuiet = 5 * time.Millisecond
)

// hookBinary is the hook the container runtime runs, as installed on the
// host: the small static carve-hook, or the agent's own binary.
type hookBinary struct {
	path  string
	small bool
}

// argv is the hook's command line up to its flags.
func (h hookBinary) argv(hook string) []string {
	if h.small {
		return []string{"carve-hook", hook}
	}
	return []string{"carve", "hook", hook}
}

// installHookBinary copies the hook into the state directory, which is the
// same path on the host: the container runtime runs the hook from there, on
// the host, where the agent's image is not. The hook is the small static
// carve-hook beside the agent's binary (the image ships it), else the
// agent's own binary, which has the same hooks under `carve hook`.
func installHookBinary(stateDir string) (hookBinary, error) {
	self, err := os.Executable()
	if err != nil {
		return hookBinary{}, err
	}
	src, h := self, hookBinary{path: filepath.Join(stateDir, "bin", "carve")}
	if small := filepath.Join(filepath.Dir(self), "carve-hook"); fileExists(small) {
		src, h = small, hookBinary{path: filepath.Join(stateDir, "bin", "carve-hook"), small: true}
	}
	// Copied a buffer at a time: read whole, the agent's own binary (87
	// MiB, where no carve-hook is beside it) was the agent's memory
	// high-water mark, reached at start and never given back to the
	// kernel in full.
	in, err := os.Open(src)
	if err != nil {
		return hookBinary{}, fmt.Errorf("read the hook binary: %w", err)
	}
	defer func() { _ = in.Close() }() // only read
	if err := os.MkdirAll(filepath.Dir(h.path), 0o755); err != nil {
		return hookBinary{}, err
	}
	if err := atomicfile.WriteFrom(h.path, in, 0o755); err != nil {
		return hookBinary{}, fmt.Errorf("install the hook binary %s: %w", src, err)
	}
	return h, nil
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

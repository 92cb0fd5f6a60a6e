package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/gpuopen"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/netdev/kernelprobe"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/prepare/checkpoint"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
	"github.com/carve-dra/carve/prepare/nodeformat"
	"github.com/carve-dra/carve/prepare/status"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// Options configure the node agent.
type Options struct {
	// NoClassifier: the agent loads no BPF classifier (set where the
	// kernel is older than carve's minimum).
	NoClassifier bool
	NodeName     string
	KubeClient   kubernetes.Interface
	// StatusClient writes the claims' status (KEP-4817), off the
	// kubelet's path; nil: KubeClient. A client of its own has a rate
	// limit of its own, so that a burst of status writes never holds back
	// the claim reads every prepare makes.
	StatusClient kubernetes.Interface
	Root         string
	// CPUCacheRoot, when set, replaces Root for the CPU cache tree (see
	// discovery.Options).
	CPUCacheRoot string
	// FPGARoot, when set, replaces Root for FPGA cards and their device
	// nodes (see discovery.Options).
	FPGARoot string
	Config   *nodeconfig.NodeConfig
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// PluginsDir is the kubelet's plugins directory; the agent's socket
	// is in PluginsDir/<driver name>.
	PluginsDir string
	CDIDir     string
	StateDir   string
	// MetricsAddr serves /metrics and /healthz over HTTP when not empty.
	MetricsAddr string
	// Profiling serves net/http/pprof under /debug/pprof/ on MetricsAddr.
	Profiling bool
	// HealthAddr serves the gRPC health service (for a grpc liveness
	// probe) when not empty.
	HealthAddr string
	// PodUID turns on rolling updates: two agent versions overlap, each
	// registering under its pod's UID.
	PodUID types.UID
	// Rescan is how often the hardware is discovered again; link events
	// trigger a rescan at once.
	Rescan time.Duration
	// RegistrationWait bounds how long the agent waits, after starting,
	// for the kubelet to register it before it publishes the node's
	// devices (registered.go); 0 does not wait.
	RegistrationWait time.Duration
	// HostNetns is the path of the node's network namespace; empty means
	// <Root>/proc/1/ns/net where it exists, else the agent's own.
	HostNetns string
	// BPFPinDir is where the classifier's maps and links are pinned, on
	// bpffs, so that limits hold while the agent restarts.
	BPFPinDir string
	// NVIDIADriverRoot is where the host's NVIDIA driver files are, on the
	// host ("/" or e.g. /usr/local/nvidia); they are read below Root.
	NVIDIADriverRoot string
	// NVIDIACDIHook is the host's nvidia-cdi-hook, where it has one.
	NVIDIACDIHook string
	// NVMLReplay answers NVML from a replay file (tests, what-if).
	NVMLReplay string
	// NVMLReplayProcesses is the replay's processes file (tests).
	NVMLReplayProcesses string
	// NVMLTimeout bounds every NVML call (gpu.DefaultTimeout when 0).
	NVMLTimeout time.Duration
	// MPSShmSize bounds each claim's tmpfs, its GPU memory shares'
	// containers' and MPS daemons' /dev/shm (mps.DefaultShmSize when 0).
	MPSShmSize uint64
	// MPSCgroup is the cgroup the claims' MPS daemons are moved into, below
	// each hierarchy's root (hostcgroup.Group); "" leaves them where they
	// start, in the agent's container.
	MPSCgroup string
	// MPSCapabilities are the only capabilities the claims' MPS daemons
	// keep (mps.ParseCapabilities); nil keeps all.
	MPSCapabilities mps.Capabilities
	// MPSContextReserve is the part of each mps-policed slice left to a
	// CUDA context (memslice.Options.ContextReserve).
	MPSContextReserve uint64
	// Version is the agent's release, recorded with the node's state
	// format.
	Version string
	// DaemonSet is the agent's own DaemonSet: where set, an agent that
	// stops while it is being deleted (an uninstall) removes carve's state
	// from the node (uninstall.go).
	DaemonSet types.NamespacedName
}

// prepareConflictWait is how long a prepare waits for another claim's
// record that still holds its device (prepare.Options.ConflictWait): well
// within the kubelet's timeout for NodePrepareResources, and far under the
// retry backoff a refused prepare costs the pod.
const prepareConflictWait = 10 * time.Second

// Run runs the kubelet plugin until ctx is done or a fatal error occurs,
// which it returns. Stopped while its DaemonSet is being deleted, it then
// removes carve's state from the node.
func Run(ctx context.Context, opts Options) error {
	var ds *daemonSetWatch
	if opts.DaemonSet.Name != "" && opts.KubeClient != nil {
		ds = &daemonSetWatch{client: opts.KubeClient, namespace: opts.DaemonSet.Namespace, name: opts.DaemonSet.Name,
			onDeleted: func() { warnClaimsKept(ctx, opts) }}
		watchCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		go ds.run(watchCtx)
	}
	err := run(ctx, opts)
	if err != nil || ds == nil || !ds.uninstalling(ctx) {
		return err
	}
	return uninstallNode(ctx, opts)
}

func run(ctx context.Context, opts Options) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger := klog.FromContext(ctx)
	driverName := opts.Config.DriverName

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := prepare.NewMetrics(reg)
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	reg.MustRegister(grpcMetrics)

	// Before anything: a kernel older than carve's minimum cannot load
	// the classifier, so the agent loads none and offers no NIC (neither
	// a share's rate nor its pod guard could be enforced there); the
	// node's GPUs, FPGAs and caches are served as anywhere.
	kernelErr := kernelprobe.CheckRunning()
	if kernelErr != nil {
		logger.Error(kernelErr, "No NIC is offered on this node")
		nodeEvent(ctx, opts.KubeClient, opts.NodeName, "KernelTooOld", kernelErr.Error()+"; no NIC is offered on this node, its other devices are")
		opts.NoClassifier = true
	}
	// Before anything writes into it (the hook binary, the checkpoint).
	if err := prepare.EnsureStateDir(opts.StateDir); err != nil {
		return err
	}
	// Before anything reads the node's state: an older release's is
	// migrated, a newer one this agent cannot serve refused untouched.
	if found, err := nodeformat.Prepare(opts.StateDir, opts.BPFPinDir, opts.Version); err != nil {
		if errors.Is(err, nodeformat.ErrTooNew) {
			nodeEvent(ctx, opts.KubeClient, opts.NodeName, "NodeStateTooNew", err.Error())
		}
		return err
	} else if found != nil && found.Version != nodeformat.Current {
		logger.Info("Node state format", "found", found.Version, "writtenBy", found.WrittenBy, "serving", nodeformat.Current)
	}
	bootID, err := checkpoint.ReadBootID(opts.Root)
	if err != nil {
		return err
	}
	k, err := openKinds(ctx, opts, bootID)
	if err != nil {
		return err
	}
	defer k.close()
	for _, c := range k.collectors {
		reg.MustRegister(c)
	}

	records, err := prepare.OpenCheckpoint(opts.StateDir, bootID, func(kept string, err error) {
		metrics.CorruptCheckpoint.Inc()
		logger.Error(err, "Checkpoint unreadable; kept aside and started empty", "keptAs", kept)
	})
	if err != nil {
		return err
	}
	records.OnWrite(func(size int, d time.Duration) {
		metrics.CheckpointWrite.Observe(d.Seconds())
		metrics.CheckpointBytes.Set(float64(size))
	})
	// Written at once, claims or none: `carve shares` takes a state
	// directory without a checkpoint for one that is not the agent's.
	if err := records.Update(func(*prepare.Records) error { return nil }); err != nil {
		return fmt.Errorf("write the checkpoint in %s: %w", opts.StateDir, err)
	}
	cdiWriter, err := cdi.NewWriter(opts.CDIDir, driverName)
	if err != nil {
		return err
	}

	inv := &inventory{root: opts.Root, cpuCacheRoot: opts.CPUCacheRoot, fpgaRoot: opts.FPGARoot, cfg: opts.Config, node: opts.NodeName, metrics: metrics,
		nvml: gpuopen.Inventory(k.gpus.session, k.gpus.reason), gpuMemory: k.gpus.memory.tiers,
		kernel: (&kernelprobe.Prober{Root: opts.Root}).Probe}
	if kernelErr != nil {
		inv.build = append(inv.build, slices.NoNICs(fmt.Sprintf("the kernel is older than carve's minimum (Linux %d.%d)", kernelprobe.MinimumKernel[0], kernelprobe.MinimumKernel[1])))
	}
	if k.classifierShares > 0 {
		// Its compiled size, which Build assumes without it (as
		// `carve discover` does): a pinned map of another is refused.
		inv.build = append(inv.build, slices.ClassifierShares(k.classifierShares))
	}
	devHealth := newDeviceHealth(opts.Config, opts.NodeName, opts.StateDir, opts.Root, health.NewMetrics(reg))
	devHealth.records = records.Read
	devHealth.client = opts.KubeClient
	if opts.KubeClient != nil {
		devHealth.events = recorderEvents(podEvents(opts.KubeClient, opts.NodeName).rec)
	}
	inv.health = devHealth
	// Instances that no claim made keep their placements out of the
	// pool; which claims made which is known once the driver has read
	// the checkpoint (Restore), and the pool is built again then.
	inv.build = append(inv.build, slices.MIGOwned(k.gpus.prep.OwnsInstance))
	if _, err := inv.rescan(ctx, discovery.AnyChange()); err != nil {
		return err
	}
	k.gpus.prep.Devices = inv.devices
	driver, err := prepare.NewDriver(prepare.Options{
		DriverName: driverName, StateDir: opts.StateDir, Checkpoint: records, CDI: cdiWriter,
		Preparers: k.preparers, Devices: inv.devices, Metrics: metrics, Health: devHealth.watch(inv.devices, inv.subscribe),
		StatusClient: status.NewAsync(ctx, status.ClaimStatusWriter{Client: cmp.Or(opts.StatusClient, opts.KubeClient)}),
		ConflictWait: prepareConflictWait,
		Fatal:        func(err error) { cancel(err) },
	})
	if err != nil {
		return err
	}
	inv.rebuild()

	pluginDir := filepath.Join(opts.PluginsDir, driverName)
	for _, dir := range []string{opts.RegistrarDir, pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create kubelet plugin directory: %w", err)
		}
	}
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.KubeClient(opts.KubeClient),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		// The checkpoint's lock orders concurrent calls; serializing
		// every gRPC call would cap throughput at one claim at a time.
		kubeletplugin.Serialize(false),
		kubeletplugin.GRPCInterceptor(grpcMetrics.UnaryServerInterceptor()),
		kubeletplugin.GRPCStreamInterceptor(grpcMetrics.StreamServerInterceptor()),
	}
	if opts.PodUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(opts.PodUID))
	}
	helper, err := kubeletplugin.Start(ctx, driver, helperOpts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	// The probes are answered while the agent waits for the kubelet.
	var wg sync.WaitGroup
	defer wg.Wait()
	if opts.MetricsAddr != "" {
		srv := &http.Server{Addr: opts.MetricsAddr, Handler: metricsMux(reg, helper, opts.Profiling), ReadHeaderTimeout: 5 * time.Second}
		if err := serveHTTP(ctx, &wg, srv, func(err error) { cancel(err) }); err != nil {
			return err
		}
	}
	if opts.HealthAddr != "" {
		if err := serveHealth(ctx, &wg, opts.HealthAddr, helper, func(err error) { cancel(err) }); err != nil {
			return err
		}
	}

	awaitRegistration(ctx, helper, opts.RegistrationWait)
	published := devHealth.publishable(inv.resources())
	if err := helper.PublishResources(ctx, published); err != nil {
		return fmt.Errorf("publish resource slices: %w", err)
	}
	metrics.Publishes.Inc()
	logger.Info("Agent started", "driver", driverName, "node", opts.NodeName, "devices", len(inv.devices()))
	// Start-up (discovery, pci.ids, the first publish) is the agent's
	// peak; what it freed would otherwise stay resident for minutes, until
	// the runtime's scavenger returns it: the agent then idles at its
	// start-up peak, several times the heap it uses.
	debug.FreeOSMemory()

	rescan := opts.Rescan
	if rescan <= 0 {
		rescan = time.Minute
	}
	ticker := time.NewTicker(rescan)
	defer ticker.Stop()
	var linkEvents <-chan struct{}
	if k.linkEvents != nil {
		linkEvents = k.linkEvents.C
	}
	wg.Add(2)
	go func() { defer wg.Done(); devHealth.tracker.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := devHealth.nic.Run(ctx, devHealth.tracker); err != nil {
			logger.Error(err, "NIC error counters")
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		k.nics.WatchNestedLinks(ctx, netdev.NestedLinkOptions{Root: opts.Root, OnRemoved: nestedLinkEvents(opts)})
	}()
	for name, src := range map[string]health.Source{
		"FPGA": &fpga.HealthSource{Root: firstSet(opts.FPGARoot, opts.Root), Devices: inv.devices},
		"LLC":  &llc.HealthSource{Dir: string(resctrl.HostDir(firstSet(opts.CPUCacheRoot, opts.Root))), Devices: inv.devices, Records: records.Read},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := src.Run(ctx, devHealth.tracker); err != nil {
				logger.Error(err, "Health not watched", "kind", name)
			}
		}()
	}
	if k.gpus.session != nil {
		gpuHealth := &gpu.HealthSource{NVML: k.gpus.session.Lane(), Devices: inv.devices}
		if l := k.gpus.memory.lanes; l != nil {
			gpuHealth.Wedged = l.Wedged
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := gpuHealth.Run(ctx, devHealth.tracker); err != nil {
				logger.Error(err, "GPU health is not watched")
			}
		}()
	}
	devHealth.changed(ctx)
	ghosts := time.NewTicker(10 * time.Second)
	defer ghosts.Stop()
	for {
		changes := discovery.AnyChange()
		rescan, healthChanged := true, false
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			logger.Info("Agent stopping")
			return nil
		case <-ticker.C:
		case <-linkEvents:
			// Only the links named are read again; events were lost
			// where all is set.
			if names, all := k.linkEvents.Take(); !all {
				changes = discovery.LinksChanged(names...)
			}
		case <-devHealth.tracker.Changed():
			rescan, healthChanged = false, true
		case <-ghosts.C:
			devHealth.dropGhosts()
			continue
		}
		publish := false
		if rescan {
			changed, err := inv.rescan(ctx, changes)
			if err != nil {
				logger.Error(err, "Rediscovery failed; keeping the published slices")
				continue
			}
			if changed {
				logger.Info("Hardware changed; publishing slices again")
				publish = true
			}
			// What the rescan made the tracker decide goes out with it.
			select {
			case <-devHealth.tracker.Changed():
				healthChanged = true
			default:
			}
		}
		if healthChanged {
			devHealth.changed(ctx)
			inv.wake()
			publish = true
		}
		// A health change that changes nothing published (a device's
		// first report, healthy) publishes nothing.
		if res := devHealth.publishable(inv.resources()); publish && !reflect.DeepEqual(res, published) {
			metrics.Publishes.Inc()
			if err := helper.PublishResources(ctx, res); err != nil {
				metrics.PublishErrors.Inc()
				logger.Error(err, "Publishing slices")
				continue
			}
			published = res
		}
	}
}

package prepare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// AgentOptions configure the node agent.
type AgentOptions struct {
	NodeName   string
	KubeClient kubernetes.Interface
	Root       string
	// CPUCacheRoot, when set, replaces Root for the CPU cache tree (see
	// discovery.Options).
	CPUCacheRoot string
	Config       *nodeconfig.NodeConfig
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// PluginsDir is the kubelet's plugins directory; the agent's socket
	// is in PluginsDir/<driver name>.
	PluginsDir string
	CDIDir     string
	StateDir   string
	// MetricsAddr serves /metrics and /healthz over HTTP when not empty.
	MetricsAddr string
	// HealthAddr serves the gRPC health service (for a grpc liveness
	// probe) when not empty.
	HealthAddr string
	// PodUID turns on rolling updates: two agent versions overlap, each
	// registering under its pod's UID.
	PodUID types.UID
	// Preparers by device kind.
	Preparers map[string]Preparer
	// Rescan is how often the hardware is discovered again; link events
	// trigger a rescan at once.
	Rescan     time.Duration
	LinkEvents <-chan struct{}
	// Collectors are more metrics to serve (the NIC shares' counters).
	Collectors []prometheus.Collector
}

// RunAgent runs the kubelet plugin until ctx is done or a fatal error
// occurs, which it returns.
func RunAgent(ctx context.Context, opts AgentOptions) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	logger := klog.FromContext(ctx)
	driverName := opts.Config.DriverName

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg)
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	reg.MustRegister(grpcMetrics)
	for _, c := range opts.Collectors {
		reg.MustRegister(c)
	}

	bootID, err := ReadBootID(opts.Root)
	if err != nil {
		return err
	}
	checkpoint, err := OpenCheckpoint(opts.StateDir, bootID, func(kept string, err error) {
		metrics.CorruptCheckpoint.Inc()
		logger.Error(err, "Checkpoint unreadable; kept aside and started empty", "keptAs", kept)
	})
	if err != nil {
		return err
	}
	cdiWriter, err := NewCDIWriter(opts.CDIDir, driverName)
	if err != nil {
		return err
	}

	inv := &inventory{root: opts.Root, cpuCacheRoot: opts.CPUCacheRoot, cfg: opts.Config, node: opts.NodeName, metrics: metrics}
	if _, err := inv.rescan(ctx); err != nil {
		return err
	}
	driver, err := NewDriver(Options{
		DriverName: driverName, StateDir: opts.StateDir, Checkpoint: checkpoint, CDI: cdiWriter,
		Preparers: opts.Preparers, Devices: inv.devices, Metrics: metrics, Health: inv.watchHealth,
		StatusClient: ClaimStatusWriter{Client: opts.KubeClient},
		Fatal:        func(err error) { cancel(err) },
	})
	if err != nil {
		return err
	}
	if recs, err := checkpoint.Read(); err == nil {
		metrics.PreparedClaims.Set(float64(countCompleted(recs)))
	}

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
	if err := helper.PublishResources(ctx, inv.resources()); err != nil {
		return fmt.Errorf("publish resource slices: %w", err)
	}
	metrics.Publishes.Inc()
	logger.Info("Agent started", "driver", driverName, "node", opts.NodeName, "devices", len(inv.devices()))

	var wg sync.WaitGroup
	defer wg.Wait()
	if opts.MetricsAddr != "" {
		srv := &http.Server{Addr: opts.MetricsAddr, Handler: metricsMux(reg, helper), ReadHeaderTimeout: 5 * time.Second}
		if err := serveHTTP(ctx, &wg, srv); err != nil {
			return err
		}
	}
	if opts.HealthAddr != "" {
		if err := serveHealth(ctx, &wg, opts.HealthAddr, helper); err != nil {
			return err
		}
	}

	rescan := opts.Rescan
	if rescan <= 0 {
		rescan = time.Minute
	}
	ticker := time.NewTicker(rescan)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			logger.Info("Agent stopping")
			return nil
		case <-ticker.C:
		case <-opts.LinkEvents:
		}
		changed, err := inv.rescan(ctx)
		if err != nil {
			logger.Error(err, "Rediscovery failed; keeping the published slices")
			continue
		}
		if changed {
			logger.Info("Hardware changed; publishing slices again")
			metrics.Publishes.Inc()
			if err := helper.PublishResources(ctx, inv.resources()); err != nil {
				metrics.PublishErrors.Inc()
				logger.Error(err, "Publishing slices")
			}
		}
	}
}

// inventory holds the latest discovery and what it publishes.
type inventory struct {
	root         string
	cpuCacheRoot string
	cfg          *nodeconfig.NodeConfig
	node         string
	metrics      *Metrics
	current      atomic.Pointer[slices.Result]
	// health subscribers are woken after each rescan.
	mu      sync.Mutex
	waiters []chan struct{}
}

// rescan discovers the hardware again and reports whether what is
// published changed.
func (i *inventory) rescan(ctx context.Context) (bool, error) {
	start := time.Now()
	inv, err := discovery.Discover(ctx, discovery.Options{Root: i.root, CPUCacheRoot: i.cpuCacheRoot, Net: discovery.NetFilter{
		Include: i.cfg.Netdev.Include, Exclude: i.cfg.Netdev.Exclude, IncludeVirtual: i.cfg.Netdev.IncludeVirtual,
	}})
	i.metrics.DiscoveryDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return false, err
	}
	res := slices.Build(inv, i.cfg, i.node)
	old := i.current.Swap(&res)
	i.mu.Lock()
	for _, w := range i.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	i.mu.Unlock()
	if old == nil {
		for _, n := range res.Notices {
			klog.FromContext(ctx).Info("Not offered in full", "reason", n)
		}
		return true, nil
	}
	return !reflect.DeepEqual(old.Resources, res.Resources), nil
}

func (i *inventory) devices() map[string]slices.Entry { return i.current.Load().Index }

func (i *inventory) resources() resourceslice.DriverResources { return i.current.Load().Resources }

// watchHealth reports NIC health: a NIC whose link is down is unhealthy.
// Other kinds have nothing this agent can observe yet and are left out of
// the reports. Reports are re-sent within the kubelet's 30 s lease.
func (i *inventory) watchHealth(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	wake := make(chan struct{}, 1)
	i.mu.Lock()
	i.waiters = append(i.waiters, wake)
	i.mu.Unlock()
	defer func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		for n, w := range i.waiters {
			if w == wake {
				i.waiters = append(i.waiters[:n], i.waiters[n+1:]...)
				break
			}
		}
	}()
	refresh := time.NewTicker(20 * time.Second)
	defer refresh.Stop()
	for {
		report := kubeletplugin.DeviceHealthReport{}
		for name, e := range i.devices() {
			if e.NIC == nil {
				continue
			}
			h := kubeletplugin.HealthStatusHealthy
			if !e.NIC.LinkUsable() {
				h = kubeletplugin.HealthStatusUnhealthy
			}
			report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{PoolName: i.node, DeviceName: name, Health: h, LastUpdated: time.Now()})
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-refresh.C:
		}
	}
}

func metricsMux(reg *prometheus.Registry, helper *kubeletplugin.Helper) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if st := helper.RegistrationStatus(); st != nil && !st.PluginRegistered {
			http.Error(w, "not registered with the kubelet: "+st.Error, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

func serveHTTP(ctx context.Context, wg *sync.WaitGroup, srv *http.Server) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server")
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	return nil
}

// serveHealth runs the standard gRPC health service for the DaemonSet's grpc
// liveness probe: SERVING while the kubelet plugin is up, NOT_SERVING while
// the kubelet reports a failed registration.
func serveHealth(ctx context.Context, wg *sync.WaitGroup, addr string, helper *kubeletplugin.Helper) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health listener: %w", err)
	}
	hs := health.NewServer()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	update := func() {
		st := healthpb.HealthCheckResponse_SERVING
		if rs := helper.RegistrationStatus(); rs != nil && !rs.PluginRegistered {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", st)
	}
	update()
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				hs.Shutdown()
				srv.Stop()
				return
			case <-t.C:
				update()
			}
		}
	}()
	return nil
}

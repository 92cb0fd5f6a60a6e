package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
)

// The prepare benchmarks measure NodePrepareResources and
// NodeUnprepareResources over the plugin's real unix socket, with the
// kubelet stand-in, against the local API server (every prepare reads its
// claims from it). Each runs carve's agent and, in the same harness, a
// kubeletplugin driver that does nothing: the library's floor.

type prepareTarget struct {
	name  string
	start func(b *testing.B, cs kubernetes.Interface, node string) (registrar string, stop func())
}

var prepareTargets = []prepareTarget{
	{"carve", func(b *testing.B, cs kubernetes.Interface, node string) (string, func()) {
		h := newAgentHost(b, cs, node)
		h.start()
		waitSlices(b, cs, h)
		return h.path("plugins_registry"), func() { _ = h.stop() }
	}},
	{"library-floor", startNoopDriver},
}

// noopDriver prepares nothing and answers every claim with no devices.
type noopDriver struct{}

func (noopDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{}
	}
	return out, nil
}

func (noopDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (noopDriver) HandleError(context.Context, error, string) {}

func (noopDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func startNoopDriver(b *testing.B, _ kubernetes.Interface, node string) (string, func()) {
	dir := b.TempDir()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("CARVE_KUBECONFIG"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400 // the same client limits as carve's agent
	cs := kubernetes.NewForConfigOrDie(cfg)
	for _, d := range []string{"reg", "plugin"} {
		os.MkdirAll(filepath.Join(dir, d), 0o750)
	}
	ctx, cancel := context.WithCancel(context.Background())
	helper, err := kubeletplugin.Start(ctx, noopDriver{}, kubeletplugin.DriverName("carve.dev"), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(cs), kubeletplugin.RegistrarDirectoryPath(filepath.Join(dir, "reg")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "plugin")), kubeletplugin.Serialize(false))
	if err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "reg"), func() { helper.Stop(); cancel() }
}

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)]
}

func report(b *testing.B, prefix string, lat []time.Duration) {
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, prefix+"-p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, prefix+"-p99-ms")
}

// BenchmarkPrepare1 prepares and unprepares one claim at a time.
func BenchmarkPrepare1(b *testing.B) { benchPrepare(b, 1) }

// BenchmarkPrepare100 prepares 100 claims concurrently, one call each, as
// the kubelet does for 100 pods starting at once, then unprepares them.
func BenchmarkPrepare100(b *testing.B) { benchPrepare(b, 100) }

func benchPrepare(b *testing.B, concurrency int) {
	cs := benchClient(b)
	for _, target := range prepareTargets {
		b.Run(target.name, func(b *testing.B) {
			node := fmt.Sprintf("bench-%s-%d", target.name, concurrency)
			if target.name != "carve" {
				newAgentHost(b, cs, node) // only for the Node object and cleanup
			}
			registrar, stop := target.start(b, cs, node)
			defer stop()
			ctx := context.Background()
			p, err := kubeletstub.Register(ctx, registrar, "carve.dev", 20*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			claims := make([]kubeletstub.Claim, concurrency)
			for i := range claims {
				// Shares of one 25G NIC, 10M each: they all fit.
				claims[i] = makeClaim(b, cs, node, fmt.Sprintf("%s-%d", node, i),
					alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "10M"})
			}
			var prep, unprep []time.Duration
			var mu sync.Mutex
			start := time.Now()
			b.ResetTimer()
			for b.Loop() {
				var wg sync.WaitGroup
				for _, c := range claims {
					wg.Add(1)
					go func(c kubeletstub.Claim) {
						defer wg.Done()
						t0 := time.Now()
						if _, err := p.Prepare(ctx, c); err != nil {
							b.Error(err)
						}
						d := time.Since(t0)
						mu.Lock()
						prep = append(prep, d)
						mu.Unlock()
					}(c)
				}
				wg.Wait()
				for _, c := range claims {
					wg.Add(1)
					go func(c kubeletstub.Claim) {
						defer wg.Done()
						t0 := time.Now()
						if err := p.Unprepare(ctx, c); err != nil {
							b.Error(err)
						}
						d := time.Since(t0)
						mu.Lock()
						unprep = append(unprep, d)
						mu.Unlock()
					}(c)
				}
				wg.Wait()
			}
			b.StopTimer()
			report(b, "prepare", prep)
			report(b, "unprepare", unprep)
			b.ReportMetric(float64(len(prep))/time.Since(start).Seconds(), "claims/s")
		})
	}
}

func benchClient(b *testing.B) kubernetes.Interface {
	if os.Getenv("CARVE_KUBECONFIG") == "" {
		b.Skip("no control plane: CARVE_KUBECONFIG is not set (make bench starts one)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("CARVE_KUBECONFIG"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfigOrDie(cfg)
}

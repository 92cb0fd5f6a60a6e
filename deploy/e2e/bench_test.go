package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	tokenbucket "golang.org/x/time/rate"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
)

// The prepare benchmarks measure NodePrepareResources and
// NodeUnprepareResources over the plugin's real unix socket, with the
// kubelet stand-in, against the local API server (every prepare reads its
// claims from it). Each runs carve's agent and, in the same harness, a
// kubeletplugin driver that does nothing: the library's floor.

type prepareTarget struct {
	name string
	// start runs the driver with its API client's limits; h is the
	// agent's host (nil for others).
	start func(b *testing.B, cs kubernetes.Interface, node string, h *agentHost, limits clientLimits) (registrar string, stop func())
}

// clientLimits are a driver's API client's rate limits: queries a second
// and burst.
type clientLimits struct {
	qps   float64
	burst int
}

// defaultLimits are carve's agent's by default (--kube-api-qps,
// --kube-api-burst); the do-nothing driver gets the same. unthrottled
// takes the limit out of a benchmark: what is left is the drivers' work.
var (
	defaultLimits = clientLimits{qps: 200, burst: 400}
	unthrottled   = clientLimits{qps: 1e6, burst: 1e6}
)

var prepareTargets = []prepareTarget{
	{"carve", func(b *testing.B, cs kubernetes.Interface, _ string, h *agentHost, limits clientLimits) (string, func()) {
		if limits != defaultLimits {
			h.args = append(h.args, "--kube-api-qps", strconv.FormatFloat(limits.qps, 'f', -1, 64), "--kube-api-burst", strconv.Itoa(limits.burst))
		}
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

func startNoopDriver(b *testing.B, _ kubernetes.Interface, node string, _ *agentHost, limits clientLimits) (string, func()) {
	dir := b.TempDir()
	stop, err := runNoopDriver(node, dir, limits)
	if err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "reg"), stop
}

// runNoopDriver starts the do-nothing driver for node, its registration and
// plugin sockets under dir, against the API server CARVE_KUBECONFIG names,
// its client limited as limits says.
func runNoopDriver(node, dir string, limits clientLimits) (stop func(), err error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("CARVE_KUBECONFIG"))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(limits.qps), limits.burst
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	for _, d := range []string{"reg", "plugin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	helper, err := kubeletplugin.Start(ctx, noopDriver{}, kubeletplugin.DriverName("carve.dev"), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(cs), kubeletplugin.RegistrarDirectoryPath(filepath.Join(dir, "reg")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "plugin")), kubeletplugin.Serialize(false))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start the do-nothing driver: %w", err)
	}
	return func() { helper.Stop(); cancel() }, nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)]
}

func report(b *testing.B, prefix string, lat []time.Duration) {
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, prefix+"-p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, prefix+"-p99-ms")
}

// The network-claim benchmarks run each case against carve and the
// do-nothing driver in the same run. Every claim is a share of one NIC with
// egress and ingress limits: an interface, classes in both directions,
// classifier entries and an attach spec, for real.
//
// Steady state: another claim stays prepared on the NIC throughout, so the
// parent's HTB and IFB are there already, as on a node that runs share
// pods; that is what a typical claim meets. The first share of a parent
// (which makes the HTB and IFB) and the last (whose removal the reaper
// does after the answer) are measured on their own by
// BenchmarkPrepareFirstShare. Percentiles come from at least minSamples
// samples: a run shorter than that takes more, untimed.

const minSamples = 200

// BenchmarkPrepare1 prepares and unprepares one claim at a time.
func BenchmarkPrepare1(b *testing.B) {
	benchPrepare(b, prepareCase{concurrency: 1, limits: defaultLimits})
}

// BenchmarkPrepare100 prepares 100 claims concurrently, one call each, as
// the kubelet does for 100 pods starting at once, then unprepares them,
// round after round. Its claims/s is what each driver sustains: the rounds
// timed are those after its client's burst is spent (warm-rounds), as on a
// node where pods keep coming; the first round, on a node that has never
// had a share, is its own figure (first-round-ms).
func BenchmarkPrepare100(b *testing.B) {
	benchPrepare(b, prepareCase{concurrency: 100, limits: defaultLimits})
}

// BenchmarkPrepare100Unthrottled is BenchmarkPrepare100 with neither
// driver's API client rate-limited. With the default limits both drivers'
// cycles are paced by their clients (a claim read a prepare, 200 a
// second); without, the cycle is what each driver's own work allows, and
// carve's ratio to the do-nothing driver is its cost.
func BenchmarkPrepare100Unthrottled(b *testing.B) {
	benchPrepare(b, prepareCase{concurrency: 100, limits: unthrottled})
}

// BenchmarkPrepareFirstShare prepares and unprepares the only share of a
// NIC: each prepare makes the parent's HTB and IFB, each unprepare leaves
// them to the reaper, which is let finish before the next round.
func BenchmarkPrepareFirstShare(b *testing.B) {
	benchPrepare(b, prepareCase{concurrency: 1, firstShare: true, limits: defaultLimits})
}

// prepareCase is one prepare benchmark's shape: how many claims a round
// prepares at once, whether each is its NIC's first share, and the
// drivers' API client limits.
type prepareCase struct {
	concurrency int
	firstShare  bool
	limits      clientLimits
}

// maxWarmRounds bounds the untimed rounds before a concurrent benchmark's
// timing: carve's agent, whose first round refills its client's bucket,
// spends its burst of 400 in about 20 rounds of 100.
const maxWarmRounds = 40

func benchPrepare(b *testing.B, pc prepareCase) {
	cs := benchClient(b)
	concurrency, firstShare := pc.concurrency, pc.firstShare
	for _, target := range prepareTargets {
		b.Run(target.name, func(b *testing.B) {
			node := fmt.Sprintf("bench-%s-%d", target.name, concurrency)
			if firstShare {
				node += "-first"
			}
			if pc.limits == unthrottled {
				node += "-unthrottled"
			}
			var host *agentHost
			if target.name == "carve" {
				host = newAgentHost(b, cs, node)
			} else {
				newAgentHost(b, cs, node) // only for the Node object and cleanup
			}
			registrar, stop := target.start(b, cs, node, host, pc.limits)
			defer stop()
			ctx := context.Background()
			p, err := kubeletstub.Register(ctx, registrar, "carve.dev", 20*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			share := alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "10M", ingress: "10M"}
			if !firstShare {
				resident := makeClaim(b, cs, node, node+"-resident", share)
				if _, err := p.Prepare(ctx, resident); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = p.Unprepare(ctx, resident) }()
			}
			// Claims come and go: each round takes claims not used
			// for the last two rounds at least (a pool of fresh
			// ones, cycled), as pods with their own claims do. A
			// claim is new until the pool comes round (make bench's
			// 1 s runs never get there): a claim prepared again has
			// its status written already, which carve does not
			// write again, so a longer run measures re-prepares.
			// Shares of one 25G NIC, 10M each: they all fit.
			pool := make([]kubeletstub.Claim, max(3*concurrency, minSamples+10))
			for i := range pool {
				pool[i] = makeClaim(b, cs, node, fmt.Sprintf("%s-%d", node, i), share)
			}
			next := 0
			var prep, unprep []time.Duration
			var mu sync.Mutex
			round := func() {
				claims := make([]kubeletstub.Claim, concurrency)
				for i := range claims {
					claims[i] = pool[next%len(pool)]
					next++
				}
				for _, phase := range []func(kubeletstub.Claim) error{
					func(c kubeletstub.Claim) error { _, err := p.Prepare(ctx, c); return err },
					func(c kubeletstub.Claim) error { return p.Unprepare(ctx, c) },
				} {
					lat := make([]time.Duration, len(claims))
					var wg sync.WaitGroup
					for i, c := range claims {
						wg.Add(1)
						go func() {
							defer wg.Done()
							t0 := time.Now()
							if err := phase(c); err != nil {
								b.Error(err)
							}
							lat[i] = time.Since(t0)
						}()
					}
					wg.Wait()
					mu.Lock()
					if len(prep) == len(unprep) {
						prep = append(prep, lat...)
					} else {
						unprep = append(unprep, lat...)
					}
					mu.Unlock()
				}
				if firstShare && host != nil {
					b.StopTimer()
					waitParentClean(b, host)
					b.StartTimer()
				}
			}
			// Untimed: the first round (the blocks of classes its
			// shares leave parked are made then) and, with claims
			// prepared at once, the rounds until the client's burst
			// is spent, by a model of its bucket (a claim read a
			// prepare; the client is as fresh as the driver): until
			// a round leaves it under a round's worth of tokens and
			// no lower than the round before. Before that a driver
			// runs on its burst: the do-nothing driver's first
			// rounds of 100 took 0.1 s, its later ones 0.5 s, and
			// carve's agent, whose first round is slow and fills its
			// bucket again, spent it over some 15 rounds. What is
			// left then is what a round refills while it uses no
			// tokens (carve's unprepares: 10-20).
			var firstRound time.Duration
			warm := 0
			if !firstShare {
				bucket := tokenbucket.NewLimiter(tokenbucket.Limit(pc.limits.qps), pc.limits.burst)
				last := math.Inf(1)
				for warm < maxWarmRounds {
					t0 := time.Now()
					bucket.ReserveN(t0, concurrency)
					round()
					if warm++; warm == 1 {
						firstRound = time.Since(t0)
					}
					// Unthrottled, no burst to spend.
					if concurrency == 1 || pc.limits == unthrottled {
						break
					}
					left := bucket.TokensAt(time.Now())
					if warm > 1 && left < float64(concurrency) && left >= last-1 {
						break
					}
					last = left
				}
				prep, unprep = nil, nil
			}
			if dir := os.Getenv("CARVE_BENCH_PROFILE"); dir != "" && host != nil {
				go profileAgent(b, host, dir, b.Name())
			}
			start := time.Now()
			b.ResetTimer()
			for b.Loop() {
				round()
			}
			b.StopTimer()
			// The whole cycle's rate; not for the first share, whose
			// rounds wait for the reaper.
			cycle := float64(len(prep)) / time.Since(start).Seconds()
			for len(prep) < minSamples {
				round()
			}
			report(b, "prepare", prep)
			report(b, "unprepare", unprep)
			b.ReportMetric(float64(len(prep)), "samples")
			if !firstShare {
				b.ReportMetric(cycle, "claims/s")
				b.ReportMetric(float64(firstRound.Microseconds())/1000, "first-round-ms")
				b.ReportMetric(float64(warm), "warm-rounds")
			}
		})
	}
}

// profileAgent saves a 3-second CPU profile and execution trace of the
// agent under load into dir (CARVE_BENCH_PROFILE), named after the
// benchmark: `go tool pprof` and `go tool trace` read them.
func profileAgent(b *testing.B, h *agentHost, dir, name string) {
	name = strings.NewReplacer("/", "-").Replace(name)
	for _, p := range []struct{ path, file string }{{"profile?seconds=3", name + ".cpu.pprof"}, {"trace?seconds=3", name + ".trace"}} {
		go func() {
			resp, err := http.Get("http://" + h.metrics + "/debug/pprof/" + p.path)
			if err != nil {
				b.Logf("profile %s: %v", p.path, err)
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(filepath.Join(dir, p.file))
			if err != nil {
				b.Logf("profile %s: %v", p.path, err)
				return
			}
			defer f.Close()
			_, _ = io.Copy(f, resp.Body)
		}()
	}
}

// waitParentClean waits for the reaper to remove the NIC's HTB and IFB after
// its last share went.
func waitParentClean(b *testing.B, h *agentHost) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := exec.Command("ip", "-netns", filepath.Base(h.netns), "link", "show", "type", "ifb").Output()
		if !strings.Contains(string(out), "cvifb") {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.Fatalf("the reaper left the IFB on the node\n%s", h.logs)
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

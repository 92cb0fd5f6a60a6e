package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
)

// The held-claims benchmarks look for what grows with the claims a node
// holds: one agent holds N prepared claims (10, 100, then 1,000, shares of
// one fixture NIC, real macvlans, classes and classifier entries), and the
// prepare and unprepare of one more claim are measured at each level, with
// the checkpoint's size and write time. Nothing the agent does per call
// should cost more with 1,000 claims held than with 10.

// heldLevels are the claims held while one more is measured.
var heldLevels = []int{10, 100, 1000}

// heldShare is every held and measured claim: 10M each way of the fixture's
// 25G NIC, so that 1,000 fit.
var heldShare = alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "10M", ingress: "10M"}

// heldConfig is the node config of the held-claims agents: the default
// netdev.maxSharesPerNIC (256) would refuse the 257th share of the NIC.
const heldConfig = `apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  maxSharesPerNIC: 1100
`

func newHeldHost(b *testing.B, cs kubernetes.Interface, node string) *agentHost {
	b.Helper()
	h := newAgentHost(b, cs, node)
	cfg := h.path("nodeconfig.yaml")
	if err := os.WriteFile(cfg, []byte(heldConfig), 0o600); err != nil {
		b.Fatal(err)
	}
	h.args = append(h.args, "--config", cfg)
	return h
}

// BenchmarkPrepareHeld measures one more claim's prepare and unprepare, one
// at a time, with 10, 100 and 1,000 claims held by the same agent; each
// level's row also gives the checkpoint's size and mean write time while it
// was measured, and prepare p99 against its p99 with 10 held.
func BenchmarkPrepareHeld(b *testing.B) {
	cs := benchClient(b)
	ctx := context.Background()
	node := "bench-held"
	h := newHeldHost(b, cs, node)
	h.start()
	defer func() { _ = h.stop() }()
	waitSlices(b, cs, h)
	p, err := kubeletstub.Register(ctx, h.path("plugins_registry"), "carve.dev", 20*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	held, err := createClaims(b, cs, node, node+"-held", heldLevels[len(heldLevels)-1], heldShare)
	if err != nil {
		b.Fatal(err)
	}
	// Claims come and go as in BenchmarkPrepare1: a pool of others,
	// cycled, none of them held.
	pool, err := createClaims(b, cs, node, node+"-one", minSamples+10, heldShare)
	if err != nil {
		b.Fatal(err)
	}
	holding, next := 0, 0
	var p99At10 time.Duration
	for _, level := range heldLevels {
		if err := prepareAll(ctx, p, held[holding:level]); err != nil {
			b.Fatalf("hold %d claims: %v\n%s", level, err, tail(h))
		}
		holding = level
		b.Run(fmt.Sprintf("held-%d", level), func(b *testing.B) {
			before := scrapeCheckpoint(b, h)
			var prep, unprep []time.Duration
			one := func() {
				c := pool[next%len(pool)]
				next++
				t0 := time.Now()
				if _, err := p.Prepare(ctx, c); err != nil {
					b.Fatalf("prepare with %d held: %v\n%s", level, err, tail(h))
				}
				t1 := time.Now()
				if err := p.Unprepare(ctx, c); err != nil {
					b.Fatalf("unprepare with %d held: %v\n%s", level, err, tail(h))
				}
				prep, unprep = append(prep, t1.Sub(t0)), append(unprep, time.Since(t1))
			}
			if dir := os.Getenv("CARVE_BENCH_PROFILE"); dir != "" {
				go profileAgent(b, h, dir, b.Name())
			}
			for b.Loop() {
				one()
			}
			for len(prep) < minSamples {
				one()
			}
			after := scrapeCheckpoint(b, h)
			p99 := percentile(prep, 0.99)
			if level == heldLevels[0] {
				p99At10 = p99
			}
			report(b, "prepare", prep)
			report(b, "unprepare", unprep)
			b.ReportMetric(float64(len(prep)), "samples")
			b.ReportMetric(after.bytes/1024, "ckpt-KiB")
			if n := after.count - before.count; n > 0 {
				b.ReportMetric((after.sum-before.sum)/n*1000, "ckpt-write-ms")
			}
			if p99At10 > 0 {
				b.ReportMetric(float64(p99)/float64(p99At10), "p99-vs-10-held")
			}
		})
	}
}

// createClaims makes n allocated claims, as makeClaim does, from several
// clients at once; they are deleted together when the benchmark ends.
func createClaims(b *testing.B, cs kubernetes.Interface, node, prefix string, n int, a alloc) ([]kubeletstub.Claim, error) {
	b.Helper()
	label := map[string]string{"carve.dev/bench": prefix}
	b.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims("default").DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: "carve.dev/bench=" + prefix})
	})
	out := make([]kubeletstub.Claim, n)
	err := parallel(n, 8, func(i int) error {
		ctx := context.Background()
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: "default", Labels: label}}
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: a.request, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "carve-e2e"}}}
		created, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create claim %s: %w", c.Name, err)
		}
		created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: a.request, Driver: "carve.dev", Pool: node, Device: a.device,
				ShareID: ptr.To(types.UID(uuid.NewUUID())), ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
					"egressBandwidth": resource.MustParse(a.egress), "ingressBandwidth": resource.MustParse(a.ingress)}}}}}
		if _, err := cs.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("allocate claim %s: %w", c.Name, err)
		}
		out[i] = kubeletstub.Claim{Namespace: "default", Name: created.Name, UID: string(created.UID)}
		return nil
	})
	return out, err
}

// prepareAll prepares the claims, one call each, eight at a time: pods
// starting on a busy node.
func prepareAll(ctx context.Context, p *kubeletstub.Plugin, claims []kubeletstub.Claim) error {
	return parallel(len(claims), 8, func(i int) error {
		_, err := p.Prepare(ctx, claims[i])
		return err
	})
}

// parallel runs fn for 0..n-1 on workers goroutines and returns the errors.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// checkpointStats is what the agent's metrics say of its checkpoint writes.
type checkpointStats struct{ sum, count, bytes float64 }

func scrapeCheckpoint(b *testing.B, h *agentHost) checkpointStats {
	b.Helper()
	var s checkpointStats
	for _, line := range strings.Split(h.scrape(), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "carve_checkpoint_write_duration_seconds_sum":
			s.sum = v
		case "carve_checkpoint_write_duration_seconds_count":
			s.count = v
		case "carve_checkpoint_bytes":
			s.bytes = v
		}
	}
	if s.count == 0 {
		b.Fatalf("the agent's metrics have no checkpoint writes\n%s", tail(h))
	}
	return s
}

// tail is the end of the agent's log, for a failure's message.
func tail(h *agentHost) string {
	if h.logs == nil {
		return ""
	}
	s := h.logs.String()
	if len(s) > 8000 {
		s = s[len(s)-8000:]
	}
	return s
}

// BenchmarkAgentMemory reads the agent's VmRSS and VmHWM (/proc/<pid>/status)
// idle after start and with 500 claims held, and logs the top of its heap
// profile then; the do-nothing driver, run as a process of its own, holding
// the same claims, is the reference.
func BenchmarkAgentMemory(b *testing.B) {
	cs := benchClient(b)
	const hold = 500
	for _, target := range []string{"carve", "library-floor"} {
		b.Run(target, func(b *testing.B) {
			ctx := context.Background()
			node := "bench-mem-" + target
			h := newHeldHost(b, cs, node)
			var pid int
			registrar := h.path("plugins_registry")
			if target == "carve" {
				h.start()
				defer func() { _ = h.stop() }()
				waitSlices(b, cs, h)
				pid = h.proc.Process.Pid
			} else {
				var stop func()
				registrar, pid, stop = startNoopProcess(b, node)
				defer stop()
			}
			p, err := kubeletstub.Register(ctx, registrar, "carve.dev", 20*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			claims, err := createClaims(b, cs, node, node, hold, heldShare)
			if err != nil {
				b.Fatal(err)
			}
			// Idle: started, registered, its slices published, the
			// claims created in the API server but none prepared.
			time.Sleep(2 * time.Second)
			idle := procStatus(b, pid)
			if err := prepareAll(ctx, p, claims); err != nil {
				b.Fatalf("hold %d claims: %v\n%s", hold, err, tail(h))
			}
			time.Sleep(2 * time.Second)
			var held map[string]float64
			for b.Loop() {
				held = procStatus(b, pid)
			}
			b.ReportMetric(idle["VmRSS"], "idle-rss-MiB")
			b.ReportMetric(idle["VmHWM"], "idle-hwm-MiB")
			b.ReportMetric(held["VmRSS"], "held-rss-MiB")
			b.ReportMetric(held["VmHWM"], "held-hwm-MiB")
			if target == "carve" {
				b.Logf("the agent's heap with %d claims held, in use:\n%s", hold, heapTop(b, h))
			}
		})
	}
}

// procStatus reads VmRSS and VmHWM of a process, in MiB.
func procStatus(b *testing.B, pid int) map[string]float64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			b.Fatalf("/proc/%d/status: %s is %q, want kB", pid, name, rest)
		}
		kb, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			b.Fatalf("/proc/%d/status: %s: %v", pid, name, err)
		}
		out[name] = kb / 1024
	}
	if len(out) != 2 {
		b.Fatalf("/proc/%d/status lacks VmRSS or VmHWM: %v", pid, out)
	}
	return out
}

// heapTop is `go tool pprof -top` of the agent's heap in use, after a GC,
// its first five functions.
func heapTop(b *testing.B, h *agentHost) string {
	b.Helper()
	resp, err := http.Get("http://" + h.metrics + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	file := filepath.Join(b.TempDir(), "heap.pprof")
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		b.Fatal(err)
	}
	_ = f.Close()
	if dir := os.Getenv("CARVE_BENCH_PROFILE"); dir != "" {
		if raw, err := os.ReadFile(file); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "agent-held.heap.pprof"), raw, 0o600)
		}
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=5", "-sample_index=inuse_space", carveBinary(b), file).CombinedOutput()
	if err != nil {
		b.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	// From the total on: a benchmark's log keeps only its first lines.
	s := string(out)
	if i := strings.Index(s, "Showing nodes"); i >= 0 {
		s = s[i:]
	}
	return s
}

// startNoopProcess runs the do-nothing driver for node as a process of its
// own (this test binary, see TestMain) and returns its registration
// directory and pid.
func startNoopProcess(b *testing.B, node string) (registrar string, pid int, stop func()) {
	b.Helper()
	dir, err := os.MkdirTemp("", "cvn") // short: unix socket paths
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var logs strings.Builder
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), noopEnv+"="+node+" "+dir)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return filepath.Join(dir, "reg"), cmd.Process.Pid, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				b.Errorf("the do-nothing driver exited with %v\n%s", err, logs.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			b.Errorf("the do-nothing driver did not stop within 15s of SIGTERM\n%s", logs.String())
		}
	}
}

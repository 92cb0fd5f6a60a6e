package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	soakParent = "carve-e2k0"
	soakServer = "carve-e2k-srv"
	soakIP     = "10.83.0.1"
)

// TestNodeAgentKillSoak (issue 29, item 3): the agent is SIGKILLed at
// random moments, over and over, while pods with NIC shares are created and
// deleted in a loop, and the kubelet is restarted a few times in the middle
// of it. After each restart every prepared share is enforced (`carve
// shares` exits 0 over all of them), and every few kills one running pod's
// traffic is checked against its share. Once the loop stops and every pod
// is deleted, nothing is left: claims in the checkpoint, links, tc classes,
// BPF pins, CDI specs, files in the state directory, shares in the
// classifier's maps. CARVE_E2E_SOAK_KILLS sets the kills: make test runs
// a few, make soak at least 100.
func TestNodeAgentKillSoak(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv("CARVE_E2E_SOAK_KILLS"))
	if kills <= 0 {
		t.Skip("set CARVE_E2E_SOAK_KILLS=N to run (make test: a few; make soak: 100)")
	}
	cs := client(t)
	env := clusterEnv(t)
	quietHost(t)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	trafficServer(t, soakParent, "carve-e2k1", soakServer, soakIP, "5201")
	buildAgentImage(t, "carve:e2e")
	buildNetTestImage(t)
	installChart(t, env, stateDir, nicNodeConfig(soakParent, "soak", "10.83.0.0/24", soakIP, ""))
	waitFor(t, "the agent ready", 90*time.Second, agentReady(cs))
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["soak"],"interfaceName":"net1"}`
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "soak", Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: shareClaimSpec(soakParent, bothWays("20M"), netCfg)}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), "soak", metav1.DeleteOptions{})
	})
	// One share pod made and deleted first: what the first share of the
	// NIC sets up for all (its shaper links, programs and state) is then
	// in the baseline, and only what a share leaves behind is not.
	warm := podWithImage("soak-warm", "carve-net-test:e2e", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("soak")})
	startPod(t, cs, warm)
	waitFor(t, "the warm-up pod running", 90*time.Second, podRunning(cs, testNS, "soak-warm"))
	if err := cs.CoreV1().Pods(testNS).Delete(ctx, "soak-warm", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the warm-up claim unprepared", 90*time.Second, func() (bool, error) {
		left := checkpointRecords(t, stateDir)
		return len(left) == 0, fmt.Errorf("%d claims in the checkpoint", len(left))
	})
	baseline := footprint(t, stateDir)

	churnCtx, stopChurn := context.WithCancel(ctx)
	churn := &soakChurn{cs: cs}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); churn.run(churnCtx) }()
	t.Cleanup(func() { stopChurn(); wg.Wait(); churn.deleteAll() })

	var killed, kubeletRestarts, enforcedChecks, trafficChecks int
	var restarts []time.Duration
	for k := 1; k <= kills; k++ {
		time.Sleep(time.Duration(200+rand.IntN(1800)) * time.Millisecond) //nolint:gosec // G404: a random pause, no secret
		pid, err := agentPID()
		if err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: SIGKILL agent %d: %v", k, pid, err)
		}
		killed++
		down := time.Now()
		if k%25 == 12 || (kills < 25 && k == (kills+1)/2) {
			// The kubelet too, in the middle of a batch.
			restartKubelet(t)
			kubeletRestarts++
		}
		waitFor(t, fmt.Sprintf("the agent back after kill %d", k), 120*time.Second, func() (bool, error) {
			p, err := agentPID()
			if err != nil || p == pid {
				return false, fmt.Errorf("agent pid %d: %v", p, err)
			}
			return agentReady(cs)()
		})
		restarts = append(restarts, time.Since(down))
		// Every prepared share enforced, as the restarted agent holds
		// them.
		waitFor(t, fmt.Sprintf("every share enforced after kill %d", k), 60*time.Second, func() (bool, error) {
			out, err := exec.Command(carveBinary(t), "shares", "--interval", "0s", "--state-dir", stateDir, "--bpf-pin-dir", e2ePins).CombinedOutput()
			return err == nil, fmt.Errorf("carve shares: %v\n%s", err, out)
		})
		enforcedChecks++
		if k%10 == 0 || k == kills {
			if name := churn.runningPod(); name != "" {
				r := <-startIperfTo(name, soakIP, "5201", 3, false)
				if r.err != nil && podGoing(cs, name) {
					// The churn deleted the pod under the client.
					t.Logf("kill %d: iperf3 in %s ended with its pod: %v", k, name, r.err)
				} else if r.err != nil {
					t.Errorf("kill %d: iperf3 in %s: %v", k, name, r.err)
				} else if ratio := r.bps / rate("20M"); ratio < 0.85 || ratio > 1.02 {
					t.Errorf("kill %d: %s's goodput %.3f of its 20M share", k, name, ratio)
				} else {
					trafficChecks++
				}
			}
		}
	}
	stopChurn()
	wg.Wait()
	churn.deleteAll()
	waitFor(t, "every soak pod gone and its claim unprepared", 180*time.Second, func() (bool, error) {
		l, err := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "carve-e2e=soak"})
		if err != nil {
			return false, err
		}
		if len(l.Items) > 0 {
			return false, fmt.Errorf("%d soak pods left", len(l.Items))
		}
		cl, err := cs.ResourceV1().ResourceClaims(testNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(cl.Items) > 0 {
			return false, fmt.Errorf("%d claims left", len(cl.Items))
		}
		if left := checkpointRecords(t, stateDir); len(left) > 0 {
			return false, fmt.Errorf("%d claims in the checkpoint", len(left))
		}
		return true, nil
	})
	var leaks []string
	waitFor(t, "the node's footprint back to where it started", 60*time.Second, func() (bool, error) {
		leaks = footprint(t, stateDir).diff(baseline)
		return len(leaks) == 0, errors.New(strings.Join(leaks, "; "))
	})
	t.Logf("soak: %d agent SIGKILLs, %d kubelet restarts; %d pods created, %d deleted; every share enforced after each restart (%d checks), %d traffic samples within the share; agent back in p50 %v, max %v; leaks: %d",
		killed, kubeletRestarts, churn.created, churn.deleted, enforcedChecks, trafficChecks,
		percentile(restarts, 0.5).Round(10*time.Millisecond), percentile(restarts, 1).Round(10*time.Millisecond), len(leaks))
}

// soakChurn creates share pods one after another, keeping up to four, and
// deletes the oldest beyond that: prepares and unprepares all the time.
type soakChurn struct {
	cs               kubernetes.Interface
	mu               sync.Mutex
	live             []string
	created, deleted int
}

func (c *soakChurn) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		name := fmt.Sprintf("soak-%04d", i)
		p := podWithImage(name, "carve-net-test:e2e", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("soak")})
		p.Labels = map[string]string{"carve-e2e": "soak"}
		if _, err := c.cs.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			time.Sleep(time.Second)
			continue
		}
		c.mu.Lock()
		c.live = append(c.live, name)
		c.created++
		var old string
		if len(c.live) > 4 {
			old, c.live = c.live[0], c.live[1:]
			c.deleted++
		}
		c.mu.Unlock()
		if old != "" {
			_ = c.cs.CoreV1().Pods(testNS).Delete(context.Background(), old, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		}
		// Until it runs, or a few seconds: a pod whose prepare the agent's
		// death interrupted is retried by the kubelet.
		for deadline := time.Now().Add(5 * time.Second); ctx.Err() == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if ok, _ := podRunning(c.cs, testNS, name)(); ok {
				break
			}
		}
	}
}

// runningPod is a live churn pod that is Running, "" where none is.
func (c *soakChurn) runningPod() string {
	c.mu.Lock()
	live := append([]string(nil), c.live...)
	c.mu.Unlock()
	for i := len(live) - 1; i >= 0; i-- {
		if ok, _ := podRunning(c.cs, testNS, live[i])(); ok {
			return live[i]
		}
	}
	return ""
}

func (c *soakChurn) deleteAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range c.live {
		_ = c.cs.CoreV1().Pods(testNS).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		c.deleted++
	}
	c.live = nil
}

// agentPID is the host PID of the running `carve agent` (the chart's
// container; hostPID lets the test see it), not one of a multi-node
// cluster's beside it.
func agentPID() (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "carve" && args[1] == "agent" && !ofMultiNodeCluster(pid) {
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !strings.Contains(string(st), ") Z ") {
				return pid, nil
			}
		}
	}
	return 0, errors.New("no carve agent process")
}

// agentReady: the chart's agent pod is Running and Ready.
func agentReady(cs kubernetes.Interface) func() (bool, error) {
	return func() (bool, error) {
		l, err := cs.CoreV1().Pods(chartNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=carve"})
		if err != nil || len(l.Items) != 1 {
			return false, fmt.Errorf("agent pods: %d, %v", len(l.Items), err)
		}
		return podReady(&l.Items[0]), fmt.Errorf("agent pod %s not Ready", l.Items[0].Name)
	}
}

// nodeFootprint is what carve holds on the node, by kind: what a share
// adds and its reclaim must take away, each thing by name.
type nodeFootprint map[string]map[string]bool

func footprint(t *testing.T, stateDir string) nodeFootprint {
	t.Helper()
	f := nodeFootprint{}
	add := func(kind, item string) {
		if f[kind] == nil {
			f[kind] = map[string]bool{}
		}
		f[kind][item] = true
	}
	for _, l := range strings.Split(strings.TrimSpace(run(t, "ip", "-o", "link", "show")), "\n") {
		fields := strings.Fields(l)
		if len(fields) < 2 {
			continue
		}
		dev := strings.TrimSuffix(strings.SplitN(fields[1], "@", 2)[0], ":")
		if multiNodeClusterLink(dev) {
			continue
		}
		add("link", dev)
		out, _ := exec.Command("tc", "class", "show", "dev", dev).Output()
		for _, c := range strings.Split(string(out), "\n") {
			if cf := strings.Fields(c); len(cf) > 2 && cf[0] == "class" {
				add("tc class", dev+" "+cf[1]+" "+cf[2])
			}
		}
	}
	files := func(kind, dir string) {
		_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				add(kind, path)
			}
			return nil
		})
	}
	files("BPF pin", e2ePins)
	files("CDI spec", "/var/run/cdi")
	files("state file", stateDir)
	for uid := range checkpointRecords(t, stateDir) {
		add("checkpoint claim", uid)
	}
	out, err := exec.Command(carveBinary(t), "shares", "-o", "json", "--interval", "0s", "--state-dir", stateDir, "--bpf-pin-dir", e2ePins).Output()
	var rows []struct {
		ClaimUID string `json:"claimUID"`
		ShareID  string `json:"shareID"`
	}
	if err == nil && json.Unmarshal(out, &rows) == nil {
		for _, r := range rows {
			add("listed share", r.ClaimUID+"/"+r.ShareID)
		}
	}
	return f
}

// diff names what f holds that base did not.
func (f nodeFootprint) diff(base nodeFootprint) []string {
	var out []string
	for kind, items := range f {
		for item := range items {
			if !base[kind][item] {
				out = append(out, kind+" "+item)
			}
		}
	}
	sort.Strings(out)
	return out
}

// podGoing reports whether a pod is gone or being deleted.
func podGoing(cs kubernetes.Interface, name string) bool {
	p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil
}

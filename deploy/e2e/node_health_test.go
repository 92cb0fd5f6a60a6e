package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	healthParent = "carve-e2h0"
	healthPeer   = "carve-e2h1"
	healthKey    = "carve.dev/unhealthy"
)

// deviceTaints reads the taints of a device from the API server: what the
// agent published, through the API server's validation.
func deviceTaints(cs kubernetes.Interface, node, device string) ([]resourceapi.DeviceTaint, error) {
	l, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return d.Taints, nil
			}
		}
	}
	return nil, fmt.Errorf("no device %s in %d slices", device, len(l.Items))
}

func carveTaint(ts []resourceapi.DeviceTaint) *resourceapi.DeviceTaint {
	for i := range ts {
		if ts[i].Key == healthKey {
			return &ts[i]
		}
	}
	return nil
}

// healthClaim asks for a 10M share of the health test's parent; tolerant
// claims tolerate carve's taint (the eviction controller honours only tolerations
// that name NoExecute).
func healthClaim(t *testing.T, cs kubernetes.Interface, name string, tolerant bool) {
	t.Helper()
	spec := shareClaimSpec(healthParent, map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse("10M")}, "")
	if tolerant {
		spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: healthKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute}}
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: spec}
	if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// claimHealth is the health and message the pod's status gives its claim's
// device.
func claimHealth(cs kubernetes.Interface, pod string) (string, string, error) {
	p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	for _, c := range p.Status.ContainerStatuses {
		for _, r := range c.AllocatedResourcesStatus {
			for _, h := range r.Resources {
				return string(h.Health), ptr.Deref(h.Message, ""), nil
			}
		}
	}
	return "", "", fmt.Errorf("pod %s: no allocatedResourcesStatus yet", pod)
}

func podGone(cs kubernetes.Interface, name string) func() (bool, error) {
	return func() (bool, error) {
		p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed, fmt.Errorf("pod %s: phase %s", name, p.Status.Phase)
	}
}

// TestNodeDeviceHealth: a NIC whose link goes down is tainted
// carve.dev/unhealthy=LinkDown within a second, through the real API
// server's validation; the pod whose claim tolerates it sees its device
// unhealthy, with the reason, in its status; with NoExecute configured for
// LinkDown the pod whose claim does not is evicted, and the stock scheduler
// leaves a new one Pending while the taint stays, also after the link is
// back, until the hold-down passes. A link flapping every second for 30 s
// makes one taint. The chart's dashboard's metrics are all in the agent's
// /metrics.
func TestNodeDeviceHealth(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	ctx := context.Background()
	node := env["CARVE_NODE_NAME"]
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	const holdDown = 8 * time.Second

	vethParent(t, healthParent, healthPeer)
	buildAgentImage(t, "carve:e2e")
	installChart(t, env, stateDir, sharedNICConfig(healthParent)+fmt.Sprintf(`health:
  holdDown: %s
  maxHoldDown: 16s
  reasons: {LinkDown: NoExecute}
`, holdDown))
	device := "nic-" + healthParent
	waitFor(t, device+" published untainted", 60*time.Second, func() (bool, error) {
		ts, err := deviceTaints(cs, node, device)
		return err == nil && carveTaint(ts) == nil, err
	})

	healthClaim(t, cs, "ha", true)
	healthClaim(t, cs, "hb", false)
	startPod(t, cs, pod("ha", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("ha")}))
	startPod(t, cs, pod("hb", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("hb")}))
	for _, p := range []string{"ha", "hb"} {
		waitFor(t, "pod "+p, 90*time.Second, podRunning(cs, testNS, p))
	}
	waitFor(t, "ha's device healthy in its status", 30*time.Second, func() (bool, error) {
		h, m, err := claimHealth(cs, "ha")
		return h == "Healthy", fmt.Errorf("health %q message %q: %v", h, m, err)
	})

	// Carrier down: the parent's peer goes down.
	down := time.Now()
	run(t, "ip", "link", "set", healthPeer, "down")
	var taint *resourceapi.DeviceTaint
	for taint == nil {
		ts, err := deviceTaints(cs, node, device)
		if err != nil {
			t.Fatal(err)
		}
		if taint = carveTaint(ts); taint == nil {
			if time.Since(down) > 10*time.Second {
				t.Fatalf("no taint 10 s after the carrier went down:\n%s", agentLogs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	latency := time.Since(down)
	t.Logf("carrier down to taint in the API server: %v", latency)
	if latency > time.Second {
		t.Errorf("tainted %v after the carrier went down, want within 1 s", latency)
	}
	if taint.Value != "LinkDown" || taint.Effect != resourceapi.DeviceTaintEffectNoExecute || taint.TimeAdded == nil {
		t.Errorf("taint %+v, want %s=LinkDown:NoExecute with its time", *taint, healthKey)
	}
	waitFor(t, "ha's device unhealthy in its status, with the reason", 30*time.Second, func() (bool, error) {
		h, m, err := claimHealth(cs, "ha")
		return h == "Unhealthy" && strings.Contains(m, "LinkDown"), fmt.Errorf("health %q message %q: %v", h, m, err)
	})
	h, m, _ := claimHealth(cs, "ha")
	t.Logf("ha's status: %s %q", h, m)
	waitFor(t, "hb evicted", 60*time.Second, podGone(cs, "hb"))
	if p, err := cs.CoreV1().Pods(testNS).Get(ctx, "ha", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("ha, whose claim tolerates the taint, was evicted too (%v)", err)
	}
	waitFor(t, "a DeviceUnhealthy event on ha", 30*time.Second, podEvent(cs, "ha", "DeviceUnhealthy"))

	// A new pod, its claim not tolerating the taint: Pending.
	healthClaim(t, cs, "hc", false)
	startPod(t, cs, pod("hc", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("hc")}))
	time.Sleep(3 * time.Second)
	// The link comes back; the taint stays for the hold-down, and hc with it.
	run(t, "ip", "link", "set", healthPeer, "up")
	back := time.Now()
	time.Sleep(holdDown / 2)
	if ts, err := deviceTaints(cs, node, device); err != nil || carveTaint(ts) == nil {
		t.Errorf("taint gone %v after the link came back, before the %v hold-down (%v)", time.Since(back), holdDown, err)
	}
	if p, err := cs.CoreV1().Pods(testNS).Get(ctx, "hc", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("hc scheduled onto the tainted device (node %q, %v)", p.Spec.NodeName, err)
	}
	waitFor(t, "the taint to clear", 3*holdDown, func() (bool, error) {
		ts, err := deviceTaints(cs, node, device)
		return err == nil && carveTaint(ts) == nil, err
	})
	t.Logf("link up to taint cleared: %v (hold-down %v)", time.Since(back), holdDown)
	waitFor(t, "hc to run once the taint is gone", 90*time.Second, podRunning(cs, testNS, "hc"))
	waitFor(t, "ha's device healthy again", 30*time.Second, func() (bool, error) {
		h, m, err := claimHealth(cs, "ha")
		return h == "Healthy", fmt.Errorf("health %q message %q: %v", h, m, err)
	})
	// The chart's dashboard queries what the real agent exports, with the
	// labels it uses: its health and NIC share metrics, now that shares
	// run and a taint came and went. This node has no GPU: the GPU share
	// metrics are gpu/police's (unit-tested there).
	checkDashboardMetrics(t, scrapeAgent(t), func(name string) bool { return strings.HasPrefix(name, "carve_gpu_share_") })

	// Flapping: down and up every second for 30 s makes one taint.
	stop := make(chan struct{})
	flapped := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flapped <- n
				return
			default:
			}
			_ = runQuiet("ip", "link", "set", healthPeer, "down")
			time.Sleep(500 * time.Millisecond)
			_ = runQuiet("ip", "link", "set", healthPeer, "up")
			time.Sleep(500 * time.Millisecond)
			n++
		}
	}()
	taints, tainted := 0, false
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		ts, err := deviceTaints(cs, node, device)
		if err != nil {
			t.Fatal(err)
		}
		now := carveTaint(ts) != nil
		if now && !tainted {
			taints++
		}
		tainted = now
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	flaps := <-flapped
	t.Logf("%d flaps in 30 s: %d taints", flaps, taints)
	if taints != 1 || !tainted {
		t.Errorf("%d flaps made %d taints (tainted at the end: %t), want one that holds", flaps, taints, tainted)
	}
	waitFor(t, "hc evicted once", 60*time.Second, podGone(cs, "hc"))
	unhealthy := countEvents(cs, "ha", "DeviceUnhealthy")
	if unhealthy != 2 {
		t.Errorf("ha got %d DeviceUnhealthy events, want 2 (the carrier loss and the flapping)", unhealthy)
	}
	waitFor(t, "the taint to clear after the flapping", 40*time.Second, func() (bool, error) {
		ts, err := deviceTaints(cs, node, device)
		return err == nil && carveTaint(ts) == nil, err
	})
	t.Logf("flapping stopped to taint cleared: %v", time.Since(start.Add(30*time.Second)))
}

func countEvents(cs kubernetes.Interface, pod, reason string) int {
	l, err := cs.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range l.Items {
		n += int(max(e.Count, 1))
	}
	return n
}

func podEvent(cs kubernetes.Interface, pod, reason string) func() (bool, error) {
	return func() (bool, error) {
		n := countEvents(cs, pod, reason)
		return n > 0, fmt.Errorf("%d %s events on %s", n, reason, pod)
	}
}

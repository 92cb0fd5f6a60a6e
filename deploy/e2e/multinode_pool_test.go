package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// mnPoolPods, where set, is how many pods TestMultiNodePoolAddresses
// creates (100 by default).
const mnPoolPodsEnv = "CARVE_E2E_MULTINODE_PODS"

// TestMultiNodePoolAddresses: a Deployment of 100 pods of one template, each
// with a 10M share of its node's seg0 and an address of the pool every node
// hands out, created at once: the pods spread over the three nodes, get 100
// distinct addresses, each recorded once in the API server and reachable
// from the server on the segment; once the Deployment is deleted every
// address is free again (no record left).
func TestMultiNodePoolAddresses(t *testing.T) {
	c := multiNodeCluster(t, 3)
	cs := client(t)
	ctx := context.Background()
	n := 100
	if v := os.Getenv(mnPoolPodsEnv); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a count", mnPoolPodsEnv, v)
		}
	}
	c.importImages(t)
	c.installChart(t, c.poolConfig())
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "mnpool", Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: shareClaimSpec(c.env["CARVE_SEGMENT_PARENT"], bothWays("10M"), mnNetCfg)}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), "mnpool", metav1.DeleteOptions{})
	})
	dep := spreadDeployment("mnpool", n)
	start := time.Now()
	if _, err := cs.AppsV1().Deployments(testNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = cs.AppsV1().Deployments(testNS).Delete(context.Background(), "mnpool", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
			waitFor(t, "the pool's pods gone", 3*time.Minute, podsGone(cs, "mnpool"))
		}
	})
	waitFor(t, fmt.Sprintf("%d pods Ready", n), 6*time.Minute, func() (bool, error) {
		d, err := cs.AppsV1().Deployments(testNS).Get(ctx, "mnpool", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.ReadyReplicas == int32(n), fmt.Errorf("%d of %d Ready", d.Status.ReadyReplicas, n)
	})
	t.Logf("%d pods with pool addresses Ready in %.1f s", n, time.Since(start).Seconds())

	pods, err := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=mnpool"})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, p := range pods.Items {
		perNode[p.Spec.NodeName]++
	}
	t.Logf("pods per node: %v", perNode)
	for i := 1; i <= 3; i++ {
		if perNode[c.name(i)] < n/3 {
			t.Errorf("node %s runs %d of the %d pods, want at least %d (spread)", c.name(i), perNode[c.name(i)], n, n/3)
		}
	}
	addrs := claimAddresses(t, cs, "mnpool-")
	if len(addrs) != n {
		t.Errorf("%d distinct addresses among the claims, want %d: %v", len(addrs), n, addrs)
	}
	held := poolRecords(t, cs)
	if len(held) != n {
		t.Errorf("%d address records in the API server, want %d", len(held), n)
	}
	for a := range addrs {
		if _, ok := held[a]; !ok {
			t.Errorf("address %s of claim %s has no record", a, addrs[a])
		}
	}
	unreachable := pingAll(c.env["CARVE_SEGMENT_SERVER_NS"], addrs)
	if len(unreachable) > 0 {
		t.Errorf("%d of %d addresses unreachable from the server: %v", len(unreachable), len(addrs), unreachable)
	}

	start = time.Now()
	if err := cs.AppsV1().Deployments(testNS).Delete(ctx, "mnpool", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	deleted = true
	waitFor(t, "the pool's pods gone", 3*time.Minute, podsGone(cs, "mnpool"))
	waitFor(t, "every address record gone", time.Minute, func() (bool, error) {
		left := poolRecords(t, cs)
		return len(left) == 0, fmt.Errorf("%d records left", len(left))
	})
	t.Logf("pods deleted and every address free again in %.1f s", time.Since(start).Seconds())
}

// spreadDeployment is n pods of one template, each with a claim from the
// template of the same name, spread evenly over the nodes.
func spreadDeployment(name string, n int) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	p := podWithImage(name, "carve-test:latest", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To(name)})
	p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname",
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(n)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec}}}
}

func podsGone(cs kubernetes.Interface, app string) func() (bool, error) {
	return func() (bool, error) {
		pods, err := cs.CoreV1().Pods(testNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0, fmt.Errorf("%d pods left", len(pods.Items))
	}
}

// claimAddresses maps each address in the status of the claims whose name
// starts with prefix to its claim.
func claimAddresses(t testing.TB, cs kubernetes.Interface, prefix string) map[netip.Addr]string {
	t.Helper()
	claims, err := cs.ResourceV1().ResourceClaims(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]string{}
	for _, cl := range claims.Items {
		if !strings.HasPrefix(cl.Name, prefix) {
			continue
		}
		for _, d := range cl.Status.Devices {
			if d.NetworkData == nil {
				continue
			}
			for _, ip := range d.NetworkData.IPs {
				if pfx, err := netip.ParsePrefix(ip); err == nil {
					if other, dup := out[pfx.Addr()]; dup {
						t.Errorf("claims %s and %s both have %s", other, cl.Name, pfx.Addr())
					}
					out[pfx.Addr()] = cl.Name
				}
			}
		}
	}
	return out
}

// poolRecords maps each address recorded for the pool seg to its holder.
func poolRecords(t testing.TB, cs kubernetes.Interface) map[netip.Addr]string {
	t.Helper()
	leases, err := cs.CoordinationV1().Leases(chartNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "carve.dev/address-pool"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]string{}
	for _, l := range leases.Items {
		a, err := netip.ParseAddr(l.Annotations["carve.dev/address"])
		if err != nil || l.Annotations["carve.dev/pool"] != "seg" {
			continue
		}
		out[a] = ptr.Deref(l.Spec.HolderIdentity, "")
	}
	return out
}

// pingAll pings every address once from the namespace ns (busybox ping:
// the host may have no other), eight at a time,
// and returns those that did not answer.
func pingAll(ns string, addrs map[netip.Addr]string) []string {
	var mu sync.Mutex
	var bad []string
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for a := range addrs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if out, err := exec.Command("ip", "netns", "exec", ns, "busybox", "ping", "-c", "1", "-W", "2", a.String()).CombinedOutput(); err != nil {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s (%v: %s)", a, err, strings.TrimSpace(string(out))))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return bad
}

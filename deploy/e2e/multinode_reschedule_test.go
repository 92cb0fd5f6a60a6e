package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// outOfServiceTaint is what an admin puts on a node that is gone for good
// (non-graceful node shutdown): pods that do not tolerate it are evicted,
// and the pod garbage collector deletes them by force.
var outOfServiceTaint = corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}

// nodeDeployment is a Deployment of pods with a pool address each (a claim
// of their template), all started on one node.
type nodeDeployment struct {
	c        *mnCluster
	name     string
	node     int
	replicas int
	// claims are the pods' claims while they ran on the node.
	claims []string
}

// deploymentOnNode starts the Deployment, its pods on node i alone (the
// other nodes cordoned meanwhile), and waits until all are Ready.
func (c *mnCluster) deploymentOnNode(t testing.TB, name string, replicas, node int) *nodeDeployment {
	t.Helper()
	cs := client(t)
	ctx := context.Background()
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: shareClaimSpec(c.env["CARVE_SEGMENT_PARENT"], bothWays("10M"), mnNetCfg)}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	for i := 1; i <= c.nodes; i++ {
		if i != node {
			setUnschedulable(t, cs, c.name(i), true)
			t.Cleanup(func() { setUnschedulable(t, cs, c.name(i), false) })
		}
	}
	labels := map[string]string{"app": name}
	p := podWithImage(name, "carve-test:latest", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To(name)})
	// As a workload's pods are by default: 30 s to stop, and 300 s on a
	// node that stopped answering before they are evicted (what the
	// DefaultTolerationSeconds admission adds), so that it is the admin's
	// taint, not the node's loss alone, that moves them. (With no grace
	// period an eviction would delete them from the API server at once.)
	p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(30))
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(300))})
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec}}}
	if _, err := cs.AppsV1().Deployments(testNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not waited for: pods left on a dead node would never go.
	t.Cleanup(func() {
		_ = cs.AppsV1().Deployments(testNS).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	d := &nodeDeployment{c: c, name: name, node: node, replicas: replicas}
	waitFor(t, fmt.Sprintf("%d pods of %s Ready", replicas, name), 2*time.Minute, d.readyOn(cs, func(n string) bool { return n == c.name(node) }))
	pods, err := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName != nil {
				d.claims = append(d.claims, *st.ResourceClaimName)
			}
		}
	}
	if len(d.claims) != replicas {
		t.Fatalf("%s: %d claims among its pods' statuses, want %d", name, len(d.claims), replicas)
	}
	for i := 1; i <= c.nodes; i++ {
		if i != node {
			setUnschedulable(t, cs, c.name(i), false)
		}
	}
	return d
}

// readyOn: the Deployment has all its replicas Ready, every pod of it
// (none terminating) on a node that onNode accepts.
func (d *nodeDeployment) readyOn(cs kubernetes.Interface, onNode func(string) bool) func() (bool, error) {
	return func() (bool, error) {
		pods, err := cs.CoreV1().Pods(testNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + d.name})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return false, fmt.Errorf("pod %s on %s is terminating", p.Name, p.Spec.NodeName)
			}
			if !onNode(p.Spec.NodeName) {
				return false, fmt.Errorf("pod %s on %q", p.Name, p.Spec.NodeName)
			}
			if podReady(&p) {
				ready++
			}
		}
		return ready == d.replicas && len(pods.Items) == d.replicas, fmt.Errorf("%d of %d pods Ready (%d pods)", ready, d.replicas, len(pods.Items))
	}
}

// rescheduledAfterOutOfService taints the Deployment's node, now dead, out
// of service and checks that, within mnRescheduleBound, its pods are gone,
// their claims released (deleted), and the Deployment Ready on the other
// nodes: new claims, distinct addresses recorded by the nodes that run
// them, each answering the segment's server.
func (d *nodeDeployment) rescheduledAfterOutOfService(t testing.TB, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	dead := d.c.name(d.node)
	// Until the taint, the pods stay where they were, not deleted.
	before, err := cs.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.name})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range before.Items {
		if p.Spec.NodeName != dead || p.DeletionTimestamp != nil {
			t.Errorf("before the out-of-service taint: pod %s on %s (deleting: %v), want it on %s, not deleted", p.Name, p.Spec.NodeName, p.DeletionTimestamp != nil, dead)
		}
	}
	if len(before.Items) != d.replicas {
		t.Errorf("before the out-of-service taint: %d pods of %s, want %d", len(before.Items), d.name, d.replicas)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, dead, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, outOfServiceTaint)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("taint %s out of service: %v", dead, err)
	}
	start := time.Now()
	waitFor(t, "the dead node's claims released", mnRescheduleBound, func() (bool, error) {
		for _, name := range d.claims {
			if _, err := cs.ResourceV1().ResourceClaims(testNS).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("claim %s still there (%v)", name, err)
			}
		}
		return true, nil
	})
	released := time.Since(start)
	waitFor(t, fmt.Sprintf("%s Ready on the other nodes", d.name), mnRescheduleBound-released, d.readyOn(cs, func(n string) bool { return n != "" && n != dead }))
	t.Logf("%s tainted out of service: its %d claims released after %.1f s, the Deployment Ready on the other nodes after %.1f s (bound %v)",
		dead, len(d.claims), released.Seconds(), time.Since(start).Seconds(), mnRescheduleBound)
	addrs := claimAddresses(t, cs, d.name+"-")
	if len(addrs) != d.replicas {
		t.Errorf("%d distinct addresses among %s's claims, want %d: %v", len(addrs), d.name, d.replicas, addrs)
	}
	held := poolRecords(t, cs)
	for a, claim := range addrs {
		if h, ok := held[a]; !ok || strings.HasPrefix(h, dead+"/") {
			t.Errorf("address %s of claim %s: recorded by %q, want a live node", a, claim, h)
		}
	}
	if unreachable := pingAll(d.c.env["CARVE_SEGMENT_SERVER_NS"], addrs); len(unreachable) > 0 {
		t.Errorf("%d of %d addresses unreachable from the server: %v", len(unreachable), len(addrs), unreachable)
	}
}

// setUnschedulable cordons (or uncordons) a node.
func setUnschedulable(t testing.TB, cs kubernetes.Interface, node string, unschedulable bool) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.Unschedulable == unschedulable {
			return nil
		}
		n.Spec.Unschedulable = unschedulable
		_, err = cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Errorf("node %s unschedulable=%v: %v", node, unschedulable, err)
	}
}

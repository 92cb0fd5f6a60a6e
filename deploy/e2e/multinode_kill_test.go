package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// mnKillEnv, set to 1, lets TestMultiNodeKilledNode kill the last node:
// the cluster has one node fewer after it, so it runs last, on its own.
const mnKillEnv = "CARVE_E2E_MULTINODE_KILL"

// mnReclaimBound is the documented bound (netdev/addrbook) for a killed
// node's addresses on the local multi-node cluster: the node lifecycle
// controller's grace period (20 s) and monitor period (2 s), the agents'
// ReclaimAfter (30 s) and a sweep interval with its jitter (33 s).
const mnReclaimBound = 85 * time.Second

// mnRescheduleBound is how long, once an admin marks a dead node out of
// service, its Deployment's pods may take to run again on the other nodes:
// eviction at once, the pod garbage collector's period (20 s) to delete the
// evicted pods by force, the claims' release, and new pods started.
const mnRescheduleBound = 2 * time.Minute

// mnKillReplicas is the Deployment's size on the node that is killed.
const mnKillReplicas = 3

// TestMultiNodeKilledNode: pods with pool addresses on the last node, whose
// init is then SIGKILLed (the node and everything on it gone at once, as a
// machine that loses power): within the documented bound the other nodes'
// agents free every address it held. Then, as an admin does for a node that
// will not come back, the node is tainted out of service: the pods of a
// Deployment that ran on it are deleted, their claims released, and the
// Deployment runs again on the other nodes, with claims of their devices
// and addresses of the same pool.
func TestMultiNodeKilledNode(t *testing.T) {
	c := multiNodeCluster(t, 2)
	if os.Getenv(mnKillEnv) != "1" {
		t.Skipf("kills a node of the cluster: set %s=1 (make multinode-e2e runs it last)", mnKillEnv)
	}
	cs := client(t)
	ctx := context.Background()
	victim := c.nodes
	c.importImages(t)
	c.installChart(t, c.poolConfig())
	dep := c.deploymentOnNode(t, "mnkilldep", mnKillReplicas, victim)
	for i := 0; i < 5; i++ {
		sharePod{name: fmt.Sprintf("mnkill%d", i), parent: c.env["CARVE_SEGMENT_PARENT"], capacity: bothWays("10M"), netCfg: mnNetCfg,
			image: "carve-test:latest", mutate: func(p *corev1.Pod) {
				c.onNode(victim)(p)
				// Not evicted while the test watches: the
				// addresses must go by the node's death alone.
				p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
			}}.start(t, cs)
	}
	for i := 0; i < 5; i++ {
		waitFor(t, "pod mnkill"+strconv.Itoa(i), 2*time.Minute, podRunning(cs, testNS, fmt.Sprintf("mnkill%d", i)))
	}
	onVictim := func() []string {
		var out []string
		for a, h := range poolRecords(t, cs) {
			if strings.HasPrefix(h, c.name(victim)+"/") {
				out = append(out, a.String())
			}
		}
		return out
	}
	if held := onVictim(); len(held) != 5+mnKillReplicas {
		t.Fatalf("%d addresses recorded for %s, want its %d pods': %v", len(held), c.name(victim), 5+mnKillReplicas, held)
	}
	pid, err := strconv.Atoi(c.env[fmt.Sprintf("CARVE_NODE_%d_PID", victim)])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill node %d's init (%d): %v", victim, pid, err)
	}
	killed := time.Now()
	waitFor(t, "the killed node's addresses freed", 2*mnReclaimBound, func() (bool, error) {
		held := onVictim()
		return len(held) == 0, fmt.Errorf("%d still recorded: %v", len(held), held)
	})
	took := time.Since(killed)
	t.Logf("node %s killed: its %d addresses free after %.1f s (bound %v)", c.name(victim), 5+mnKillReplicas, took.Seconds(), mnReclaimBound)
	if took > mnReclaimBound {
		t.Errorf("the killed node's addresses were freed after %.1f s, over the documented bound %v", took.Seconds(), mnReclaimBound)
	}
	dep.rescheduledAfterOutOfService(t, cs)
	// The pods of the dead node are deleted by force, as an admin does
	// for a node that will not come back.
	for i := 0; i < 5; i++ {
		_ = cs.CoreV1().Pods(testNS).Delete(ctx, fmt.Sprintf("mnkill%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}
	// With the node still down, and no claim of carve's held any more,
	// `helm uninstall` passes its hook and completes: the hook's pod runs
	// on a live node.
	if err := cs.AppsV1().Deployments(testNS).Delete(ctx, dep.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no claim of the test's reserved", 2*time.Minute, func() (bool, error) {
		claims, err := cs.ResourceV1().ResourceClaims(testNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, cl := range claims.Items {
			if len(cl.Status.ReservedFor) > 0 {
				return false, fmt.Errorf("claim %s reserved for %s", cl.Name, cl.Status.ReservedFor[0].Name)
			}
		}
		return true, nil
	})
	start := time.Now()
	kc := os.Getenv("CARVE_KUBECONFIG")
	if out, err := exec.Command(os.Getenv("CARVE_HELM"), "uninstall", "carve", "--kubeconfig", kc, "--namespace", chartNamespace,
		"--wait", "--timeout", "90s").CombinedOutput(); err != nil {
		t.Errorf("helm uninstall with %s down: %v\n%s", c.name(victim), err, out)
	} else {
		t.Logf("helm uninstall with %s down: done in %.1f s", c.name(victim), time.Since(start).Seconds())
	}
}

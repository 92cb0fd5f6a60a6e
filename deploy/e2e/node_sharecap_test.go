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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/slices/names"
)

const (
	capParent = "carve-e2c0"
	capServer = "carve-e2c-srv"
	capIP     = "10.81.0.1"
)

// TestNodeShareLimit: a NIC whose node config sets netdev.maxSharesPerNIC
// to 2 publishes a "shares" capacity of 2, of which each claim consumes 1
// without asking. Two pods fill it; the real scheduler leaves a third
// Pending, however little bandwidth it asks for, while the two keep passing
// traffic held to their shares; once one goes, the third runs.
func TestNodeShareLimit(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	quietHost(t)
	ctx := context.Background()
	node := env["CARVE_NODE_NAME"]
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")

	trafficServer(t, capParent, "carve-e2c1", capServer, capIP, "5201", "5202")
	buildAgentImage(t, "carve:e2e")
	buildNetTestImage(t)
	installChart(t, env, stateDir, nicNodeConfig(capParent, "cap", "10.81.0.0/24", capIP, "  maxSharesPerNIC: 2\n"))

	// Published as the agent built it, through the API server's
	// validation: 2 shares, each claim taking exactly 1.
	device := "nic-" + capParent
	waitFor(t, "a shares capacity of 2 on "+device, 60*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name != device {
					continue
				}
				c, ok := d.Capacity[names.CapShares]
				rp := c.RequestPolicy
				good := ok && c.Value.Value() == 2 && rp != nil && rp.Default != nil && rp.Default.Value() == 1 &&
					rp.ValidRange != nil && rp.ValidRange.Min.Value() == 1 && rp.ValidRange.Max != nil && rp.ValidRange.Max.Value() == 1
				return good, fmt.Errorf("%s capacity %+v", device, d.Capacity)
			}
		}
		return false, fmt.Errorf("no device %s in %d slices", device, len(l.Items))
	})

	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["cap"],"interfaceName":"net1"}`
	share := func(name string) {
		sharePod{name: name, parent: capParent, capacity: bothWays("50M"), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
	}
	for _, name := range []string{"cap-a", "cap-b"} {
		share(name)
		waitFor(t, "pod "+name, 90*time.Second, podRunning(cs, testNS, name))
	}
	for _, name := range []string{"cap-a", "cap-b"} {
		claim, err := cs.ResourceV1().ResourceClaims(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil {
			t.Fatalf("claim %s of a running pod is not allocated", name)
		}
		r := claim.Status.Allocation.Devices.Results
		if len(r) != 1 {
			t.Fatalf("claim %s allocated %+v, want one device", name, r)
		}
		if q := r[0].ConsumedCapacity[names.CapShares]; r[0].Device != device || q.Value() != 1 {
			t.Errorf("claim %s allocated %+v, want 1 share of %s", name, r, device)
		}
	}

	// The third: Pending, unallocated, with the scheduler's reason.
	share("cap-c")
	var why string
	waitFor(t, "cap-c unschedulable", 60*time.Second, func() (bool, error) {
		p, err := cs.CoreV1().Pods(testNS).Get(ctx, "cap-c", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				why = c.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s, node %q, conditions %+v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
	})
	t.Logf("cap-c's PodScheduled condition: %s", why)
	if !strings.Contains(why, "cannot allocate all claims") {
		t.Errorf("cap-c unschedulable for another reason than its claim: %s", why)
	}
	// Still so a while later: no allocation slipped through.
	time.Sleep(5 * time.Second)
	p, err := cs.CoreV1().Pods(testNS).Get(ctx, "cap-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Errorf("cap-c on node %q, phase %s; want Pending on no node", p.Spec.NodeName, p.Status.Phase)
	}
	c, err := cs.ResourceV1().ResourceClaims(testNS).Get(ctx, "cap-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation != nil {
		t.Errorf("cap-c's claim allocated %+v; want no allocation", c.Status.Allocation)
	}

	// The two running pods still pass traffic, each held to its share.
	for _, reverse := range []bool{false, true} {
		dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
		results := map[string]chan iperfResult{}
		for name, port := range map[string]string{"cap-a": "5201", "cap-b": "5202"} {
			results[name] = startIperfTo(name, capIP, port, 3, reverse)
		}
		for name, ch := range results {
			r := <-ch
			if r.err != nil {
				t.Fatalf("iperf3 in %s: %v", name, r.err)
			}
			ratio := r.bps / rate("50M")
			t.Logf("%s %s: %.1f Mbit/s goodput of a 50M share (ratio %.3f)", name, dir, r.bps/1e6, ratio)
			if ratio < 0.8 || ratio > 1.02 {
				t.Errorf("%s %s: goodput ratio %.3f of its share", name, dir, ratio)
			}
		}
	}

	// One goes, its claim with it: the third is scheduled and runs.
	if err := cs.CoreV1().Pods(testNS).Delete(ctx, "cap-a", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := cs.ResourceV1().ResourceClaims(testNS).Delete(ctx, "cap-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod cap-c once cap-a went", 120*time.Second, podRunning(cs, testNS, "cap-c"))
}

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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/discovery/sysfstest"
)

// fixtureFPGAID numbers the fixture DFL card's nodes (dfl-fme.97,
// dfl-port.97): no host this runs on has that many cards.
const fixtureFPGAID = 97

// TestNodeExtendedResourceFPGA: on the real node, a pod asking the classic
// way, resources.limits {carve.dev/fpga: 1}, is scheduled with a claim the
// scheduler makes from the fpga.carve.dev DeviceClass's
// extendedResourceName (DRAExtendedResource), the kubelet has carve
// prepare it, and the container gets the card's device nodes. The card is
// a fixture (--fpga-root) whose nodes are real character devices (null's
// numbers) made on the host for the test.
func TestNodeExtendedResourceFPGA(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	ctx := context.Background()
	node := env["CARVE_NODE_NAME"]
	clusterDir := filepath.Dir(os.Getenv("CARVE_KUBECONFIG"))
	stateDir := filepath.Join(clusterDir, "carve-state")

	// Under the cluster's directory, which the agent sees under /host.
	dir, err := os.MkdirTemp(clusterDir, "fpga-fixture-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sysfstest.New(dir).AddDFL(sysfstest.DFL{Address: "0000:d8:00.0", ID: fixtureFPGAID, AFUID: sysfstest.TypicalAFUID})
	nodes := []string{fmt.Sprintf("dfl-fme.%d", fixtureFPGAID), fmt.Sprintf("dfl-port.%d", fixtureFPGAID)}
	for _, n := range nodes {
		for _, p := range []string{filepath.Join(dir, "dev", n), filepath.Join("/dev", n)} {
			_ = os.Remove(p)
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatalf("mknod %s: %v", p, err)
			}
		}
		t.Cleanup(func() { os.Remove(filepath.Join("/dev", n)) })
	}

	buildAgentImage(t, "carve:e2e")
	installChartWith(t, env, stateDir, []string{"--set-string", "fpgaRoot=" + filepath.Clean(dir)}, "apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n")
	const device = "fpga-0000-d8-00-0"
	waitFor(t, "the fixture FPGA published for "+node, 60*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name == device {
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("%d slices without %s", len(l.Items), device)
	})

	p := pod("e2e-fpga-classic")
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"carve.dev/fpga": resource.MustParse("1")}
	startPod(t, cs, p)
	waitFor(t, "the pod asking carve.dev/fpga: 1", 90*time.Second, podRunning(cs, testNS, p.Name))

	got, err := cs.CoreV1().Pods(testNS).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status.ExtendedResourceClaimStatus
	if st == nil || st.ResourceClaimName == "" {
		t.Fatalf("pod status has no extended resource claim: %+v", got.Status)
	}
	claim, err := cs.ResourceV1().ResourceClaims(testNS).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Device != device {
		t.Fatalf("the scheduler's claim %s is allocated %+v, want %s", claim.Name, claim.Status.Allocation, device)
	}
	envs := podExec(t, testNS, p.Name, "main", "env")
	if !strings.Contains(envs, "_KIND=fpga\n") || !strings.Contains(envs, "_DEVICE="+device+"\n") {
		t.Errorf("env lacks the FPGA:\n%s", envs)
	}
	for _, n := range nodes {
		// A character device of the host's numbers, in the container.
		out := podExec(t, testNS, p.Name, "main", "stat", "-c", "%F %t:%T", "/dev/"+n)
		if strings.TrimSpace(out) != "character special file 1:3" {
			t.Errorf("/dev/%s in the container: %q, want the host's character device 1:3", n, out)
		}
	}

	_ = cs.CoreV1().Pods(testNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	waitFor(t, "the claim unprepared", 90*time.Second, func() (bool, error) {
		recs := checkpointRecords(t, stateDir)
		return len(recs) == 0, fmt.Errorf("records %v", recs)
	})
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

// env is the control plane and the two schedulers under test.
type env struct {
	c          kubernetes.Interface
	kubeconfig string
	ns         string
	run        string // unique suffix of this run's objects
}

func setup(t *testing.T) *env {
	t.Helper()
	kc := os.Getenv("CARVE_KUBECONFIG")
	if kc == "" {
		t.Skip("CARVE_KUBECONFIG is not set: run from `make scheduler-e2e`, which starts a control plane")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{c: c, kubeconfig: kc, run: fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)}
	e.ns = "sched-e2e-" + e.run
	ctx := t.Context()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, dc := range fixture.Classes() {
		_, _ = c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
	}
	t.Cleanup(func() {
		ctx := context.Background()
		zero := int64(0)
		_ = c.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = c.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{})
		sel := "e2e.carve.dev/run=" + e.run
		_ = c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
		_ = c.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
	})
	return e
}

// node creates a 4-CPU node with a carve server's pool (fixture.Server)
// labelled with the scenario and the scheduler it is for.
func (e *env) node(t *testing.T, name, scenario, set string) string {
	t.Helper()
	ctx := t.Context()
	name = name + "-" + e.run
	labels := map[string]string{"e2e.carve.dev/run": e.run, "e2e.carve.dev/scenario": scenario, "e2e.carve.dev/set": set, "kubernetes.io/hostname": name}
	if _, err := e.c.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("16Gi"), v1.ResourcePods: resource.MustParse("110")}
	status, _ := json.Marshal(map[string]v1.NodeStatus{"status": {Capacity: res, Allocatable: res,
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "E2E", LastHeartbeatTime: metav1.Now()}}}})
	if _, err := e.c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	s := fixture.Server(name, "100G", "80Gi")
	s.Labels = map[string]string{"e2e.carve.dev/run": e.run}
	if _, err := e.c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// occupy binds a pod asking for cpu to node, holding shares of the named
// devices (a claim per device, allocated and reserved for the pod as the
// scheduler would have done), so the stock scheduler's LeastAllocated
// scoring prefers the node's twin.
func (e *env) occupy(t *testing.T, node, cpu string, shares map[string]resourceapi.ResourceClaimSpec) {
	t.Helper()
	ctx := t.Context()
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "occupant-" + strings.TrimSuffix(node, "-"+e.run)},
		Spec: v1.PodSpec{NodeName: node, Tolerations: []v1.Toleration{{Operator: v1.TolerationOpExists}},
			Containers: []v1.Container{{Name: "c", Image: "carve-test:latest", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)}}}}},
	}
	for dev := range shares {
		cn := p.Name + "-" + dev[:3]
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: dev[:3], ResourceClaimName: &cn})
	}
	p, err := e.c.CoreV1().Pods(e.ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for dev, spec := range shares {
		claim, err := e.c.ResourceV1().ResourceClaims(e.ns).Create(ctx, fixture.Claim(e.ns, p.Name+"-"+dev[:3], spec), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fixture.Allocate(claim, node, dev)
		claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
		if _, err := e.c.ResourceV1().ResourceClaims(e.ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// pod creates a pod for scheduler on the nodes of scenario and set, with a
// claim per spec, and returns the node it gets bound to.
func (e *env) pod(t *testing.T, scheduler, scenario, set string, specs map[string]resourceapi.ResourceClaimSpec) string {
	t.Helper()
	ctx := t.Context()
	name := scenario + "-" + set
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1.PodSpec{SchedulerName: scheduler, Tolerations: []v1.Toleration{{Operator: v1.TolerationOpExists}},
			NodeSelector: map[string]string{"e2e.carve.dev/run": e.run, "e2e.carve.dev/scenario": scenario, "e2e.carve.dev/set": set},
			Containers:   []v1.Container{{Name: "c", Image: "carve-test:latest"}}},
	}
	for cname, spec := range specs {
		claim := fixture.Claim(e.ns, name+"-"+cname, spec)
		if _, err := e.c.ResourceV1().ResourceClaims(e.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: cname, ResourceClaimName: &claim.Name})
	}
	if _, err := e.c.CoreV1().Pods(e.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var node string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := e.c.CoreV1().Pods(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = got.Spec.NodeName
		return node != "", nil
	})
	if err != nil {
		t.Fatalf("pod %s was not bound by %s: %v", name, scheduler, err)
	}
	return strings.TrimSuffix(node, "-"+e.run)
}

// scheduler starts binary with one profile named name (and the given
// profile body) on port, stopped when the test ends.
func (e *env) scheduler(t *testing.T, binary, name string, port int, profile string) {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: %s\nleaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: %s\n%s", e.kubeconfig, name, profile)
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "--config="+path, "--authentication-kubeconfig="+e.kubeconfig, "--authorization-kubeconfig="+e.kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port), "--v=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			lines := strings.Split(string(out), "\n")
			t.Logf("%s log (last lines):\n%s", name, strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	})
}

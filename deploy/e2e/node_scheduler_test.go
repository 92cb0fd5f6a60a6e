package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// schedulerName is the chart's default scheduler.schedulerName; the chart
// names its Deployment, Lease and ServiceAccount carve-scheduler too.
const schedulerName = "carve-scheduler"

// TestNodeCarveScheduler installs the chart with scheduler.enabled=true on
// the real node: the carve-scheduler image (bin/carve-scheduler, built as
// `make build` does) runs as the chart's Deployment, takes its leader Lease
// with the chart's RBAC, and binds a pod that names it and asks for a carve
// bandwidth share, which the agent then prepares: the pod runs.
func TestNodeCarveScheduler(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")

	const parent = "carve-sch0"
	vethParent(t, parent, "carve-sch1")

	buildAgentImage(t, "carve:e2e")
	buildSchedulerImage(t, "carve-scheduler:e2e")
	installChartWith(t, env, stateDir, []string{
		"--set", "scheduler.enabled=true",
		"--set", "scheduler.image.repository=carve-scheduler,scheduler.image.tag=e2e,scheduler.image.pullPolicy=Never",
		// The node's own kube-scheduler port must stay free.
		"--set", "scheduler.hostNetwork=true", "--set", "scheduler.securePort=29259", "--set", "scheduler.logVerbosity=2",
		"--set-string", "scheduler.extraEnv[0].name=KUBERNETES_SERVICE_HOST,scheduler.extraEnv[0].value=127.0.0.1",
		"--set-string", "scheduler.extraEnv[1].name=KUBERNETES_SERVICE_PORT,scheduler.extraEnv[1].value=" + env["CARVE_APISERVER_PORT"],
	}, sharedNICConfig(parent))
	// Registered after the install, so it runs before the uninstall.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("carve-scheduler logs:\n%s", schedulerLogs(t))
		}
	})

	// helm --wait has waited for the Deployment; its pod is Ready, so the
	// scheduler answers /readyz. The Lease says it leads.
	waitFor(t, "carve-scheduler's Deployment available", 60*time.Second, deploymentAvailable(cs, chartNamespace, schedulerName))
	waitFor(t, "carve-scheduler's leader Lease", 60*time.Second, func() (bool, error) {
		l, err := cs.CoordinationV1().Leases(chartNamespace).Get(ctx, schedulerName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		return holder != "", fmt.Errorf("lease held by %q", holder)
	})
	waitFor(t, "carve's NIC slice", 60*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + env["CARVE_NODE_NAME"]})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name == "nic-"+parent {
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("%d slices, none with nic-%s", len(l.Items), parent)
	})

	claim := "sched-net"
	createShareTemplate(t, cs, claim, parent, "100M")
	p := pod("e2e-sched", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To(claim)})
	p.Spec.SchedulerName = schedulerName
	startPod(t, cs, p)
	waitFor(t, "the pod carve-scheduler places", 90*time.Second, podRunning(cs, testNS, p.Name))

	// carve-scheduler bound it (the stock scheduler ignores the pod), and
	// the claim holds a share of the NIC.
	ev, err := cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",reason=Scheduled"})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]bool{}
	for _, e := range ev.Items {
		by[e.ReportingController] = true
		by[e.Source.Component] = true
	}
	if !by[schedulerName] {
		t.Errorf("Scheduled events from %v, want %s", by, schedulerName)
	}
	got, err := cs.CoreV1().Pods(testNS).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil || len(got.Status.ResourceClaimStatuses) != 1 || got.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod claim status: %v %v", got.Status.ResourceClaimStatuses, err)
	}
	c, err := cs.ResourceV1().ResourceClaims(testNS).Get(ctx, *got.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim: %+v %v", c.Status, err)
	}
	if r := c.Status.Allocation.Devices.Results[0]; r.Device != "nic-"+parent || r.ShareID == nil {
		t.Errorf("allocation %+v, want a share of nic-%s", r, parent)
	}

	// RBAC: nothing the scheduler asked for was refused, in logs that
	// show it took the lease.
	logs := strings.ToLower(schedulerLogs(t))
	if !strings.Contains(grepLines(logs, "successfully acquired lease"), `lock="`+chartNamespace+"/"+schedulerName+`"`) {
		t.Errorf("carve-scheduler's logs do not show it taking its lease:\n%s", logs)
	}
	if strings.Contains(logs, "forbidden") {
		t.Errorf("carve-scheduler was refused something:\n%s", grepLines(logs, "forbidden"))
	}
}

// buildSchedulerImage builds carve-scheduler (the scheduler module's own
// `make build`, into a temporary directory) into an image and imports it
// into the node's containerd.
func buildSchedulerImage(t testing.TB, tag string) {
	t.Helper()
	root := repoRoot()
	bin := os.Getenv("CARVE_E2E_SCHEDULER_BINARY")
	if bin == "" {
		dir := t.TempDir()
		run(t, "make", "-C", filepath.Join(root, "scheduler"), "build", "BIN="+dir)
		bin = filepath.Join(dir, "carve-scheduler")
	}
	archive := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), "--name", tag,
		"--file", bin+":/carve-scheduler", "--entrypoint", "/carve-scheduler", "--out", filepath.Join(t.TempDir(), "carve-scheduler.tar"))))
	run(t, filepath.Join(root, "deploy/images/import.sh"), archive)
}

// createShareTemplate makes a claim template for an egress share of parent.
func createShareTemplate(t testing.TB, cs kubernetes.Interface, name, parent, egress string) {
	t.Helper()
	spec := shareClaimSpec(parent, map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse(egress)}, "")
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(context.Background(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func deploymentAvailable(cs kubernetes.Interface, ns, name string) func() (bool, error) {
	return func() (bool, error) {
		d, err := cs.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range d.Status.Conditions {
			if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
				return d.Status.ReadyReplicas >= 1, fmt.Errorf("ready replicas %d", d.Status.ReadyReplicas)
			}
		}
		return false, fmt.Errorf("not available: %+v", d.Status.Conditions)
	}
}

// schedulerLogs are carve-scheduler's container logs, read through the API
// server.
func schedulerLogs(t testing.TB) string {
	kc := os.Getenv("CARVE_KUBECONFIG")
	kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
	out, err := execCommand(kubectl, "--kubeconfig", kc, "logs", "-n", chartNamespace, "deployment/"+schedulerName, "--tail=-1").CombinedOutput()
	if err != nil {
		t.Logf("carve-scheduler logs: %v", err)
	}
	return string(out)
}

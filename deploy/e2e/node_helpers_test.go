package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/bpf"
)

// e2ePins is where the agents of the node tests pin their classifier;
// removed when a test ends, so no test sees another's entries.
const e2ePins = "/sys/fs/bpf/carve-e2e"

func installChart(t testing.TB, env map[string]string, stateDir, nodeConfig string) {
	t.Helper()
	installChartWith(t, env, stateDir, nil, nodeConfig)
}

// installChartWith installs the chart with more helm arguments (values).
func installChartWith(t testing.TB, env map[string]string, stateDir string, values []string, nodeConfig string) {
	t.Helper()
	installChartFrom(t, env, stateDir, chartDir(), "e2e", values, nodeConfig)
}

// installChartFrom installs the chart at chart (an earlier release's, for
// upgrades) with the agent's image carve:tag.
func installChartFrom(t testing.TB, env map[string]string, stateDir, chart, tag string, values []string, nodeConfig string) {
	t.Helper()
	helm := os.Getenv("CARVE_HELM")
	if helm == "" {
		t.Fatal("CARVE_HELM is not set")
	}
	// The classifier's pins must be on the host's bpffs to outlive the
	// agent's container.
	if err := bpf.MountBPFFS(bpf.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte(nodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	kc := os.Getenv("CARVE_KUBECONFIG")
	// Registered first, so that a failed install is removed too.
	t.Cleanup(func() {
		// The chart's pre-delete hook refuses while a test's pod still
		// holds a claim (its deletion may not be done yet): then without
		// the hook, as TestNodeUninstall's third case does.
		if err := runQuiet(helm, "uninstall", "carve", "--kubeconfig", kc, "--namespace", chartNamespace, "--wait", "--timeout", "60s"); err != nil {
			_ = runQuiet(helm, "uninstall", "carve", "--kubeconfig", kc, "--namespace", chartNamespace, "--wait", "--timeout", "60s", "--no-hooks")
		}
		// The agent is gone before the kubelet unprepared the last pods'
		// shares: their parents' IFBs and egress shapers would stay on
		// the node.
		removeCarveShapers()
		_ = os.RemoveAll(e2ePins)
		// What the chart's defaults mounted on the host, under the state
		// dir: the init container's bind mount and the agent's MPS tmpfs.
		if err := unmountUnder(stateDir); err != nil {
			t.Error(err)
		}
	})
	// Runs before the uninstall above (cleanups run last first): on
	// failure, the agent's own account of what happened: its warnings and
	// errors only, so that the test's own failure stays among the last
	// lines, which are what a CI summary shows (60 lines of the agent's
	// start-up once hid it).
	t.Cleanup(func() {
		if t.Failed() {
			kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
			out, _ := execCommand(kubectl, "--kubeconfig", kc, "logs", "-n", chartNamespace, "-l", "app.kubernetes.io/name=carve", "--tail=400").CombinedOutput()
			t.Logf("agent logs, warnings and errors of the last 400 lines:\n%s", klogWarnings(string(out), 30))
		}
	})
	args := []string{"install", "carve", chart, "--kubeconfig", kc,
		"--namespace", chartNamespace, "--create-namespace", "--wait", "--timeout", "120s",
		"--set", "image.repository=carve,image.tag=" + tag + ",image.pullPolicy=Never",
		"--set", "kubeletDir=" + env["KUBELET_ROOT_DIR"], "--set", "cdiDir=" + env["CARVE_CDI_DIR"], "--set", "stateDir=" + stateDir,
		// The chart's mount propagation defaults, as a user installs it:
		// its init container makes the state dir and bpffs shared on this
		// host's private /.
		// metricsHost is the chart's default, loopback: with hostNetwork
		// the node's, which scrapeAgent reads.
		"--set", "hostNetwork=true", "--set", "bpfPinDir=" + e2ePins, "--set", "metricsPort=" + agentMetrics, "--set", "healthPort=29465",
		"--set-string", "extraEnv[0].name=KUBERNETES_SERVICE_HOST,extraEnv[0].value=127.0.0.1",
		"--set-string", "extraEnv[1].name=KUBERNETES_SERVICE_PORT,extraEnv[1].value=" + env["CARVE_APISERVER_PORT"],
		"--set-file", "nodeConfig=" + cfg}
	run(t, helm, append(args, values...)...)
}

func createTemplate(t testing.TB, cs kubernetes.Interface, name, egress string) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: netClaimSpec(egress)}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(context.Background(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func createClaim(t testing.TB, cs kubernetes.Interface, name, egress string) {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: netClaimSpec(egress)}
	if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func netClaimSpec(egress string) resourceapi.ResourceClaimSpec {
	return shareClaimSpec(e2eParent, map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse(egress)}, "")
}

// shareClaimSpec asks for a bandwidth share of parent, with an optional
// carve.dev/v1alpha1 NetworkConfig.
func shareClaimSpec(parent string, capacity map[resourceapi.QualifiedName]resource.Quantity, networkConfig string) resourceapi.ResourceClaimSpec {
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "net",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.carve.dev",
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["carve.dev"].ifName == "` + parent + `"`}}},
			Capacity:  &resourceapi.CapacityRequirements{Requests: capacity}},
	}}}}
	if networkConfig != "" {
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"net"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "carve.dev", Parameters: runtime.RawExtension{Raw: []byte(networkConfig)}}}}}
	}
	return spec
}

func pod(name string, claims ...*corev1.PodResourceClaim) *corev1.Pod {
	return podWithImage(name, "carve-test:latest", claims...)
}

func podWithImage(name, image string, claims ...*corev1.PodResourceClaim) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"}}},
		},
	}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, *c)
		p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c.Name})
	}
	return p
}

func createLLCClaim(t testing.TB, cs kubernetes.Interface, name string) {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "cache", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "llc.carve.dev"}}}}}}
	if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func startPod(t testing.TB, cs kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	if _, err := cs.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods(testNS).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
}

func nodeReady(cs kubernetes.Interface, node string) func() (bool, error) {
	return func() (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return false, nil
	}
}

// restartAgent deletes the agent's pod; the DaemonSet starts a new one.
func restartAgent(t testing.TB, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	l, err := cs.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=carve"})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("agent pods: %v %v", l, err)
	}
	old := l.Items[0].Name
	if err := cs.CoreV1().Pods(chartNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new agent pod", 90*time.Second, func() (bool, error) {
		l, err := cs.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=carve"})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.Name != old {
				return podRunning(cs, chartNamespace, p.Name)()
			}
		}
		return false, fmt.Errorf("old pod %s still the only one", old)
	})
}

// checkpointRecords maps each recorded claim to when its record was written.
func checkpointRecords(t testing.TB, stateDir string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(stateDir, "checkpoint.json"))
	if os.IsNotExist(err) {
		return map[string]string{}
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Data struct {
			Claims map[string]struct {
				State   string `json:"state"`
				Updated string `json:"updated"`
			} `json:"claims"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for uid, c := range f.Data.Claims {
		out[uid] = c.State + "@" + c.Updated
	}
	return out
}

func scrapeAgent(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + agentMetrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// nicNodeConfig is the node config of a real-node NIC test: parent shared,
// its bandwidth set to 10G (a veth has none of its own), and one address
// pool, name with cidr and gateway; extra is more YAML under netdev, each
// line indented as netdev's fields are ("  pools:" items or
// "  maxSharesPerNIC: 2").
func nicNodeConfig(parent, pool, cidr, gateway, extra string) string {
	return nicNodeConfigAt(parent, "    egress: 10G\n", pool, cidr, gateway, extra)
}

// nicNodeConfigAt is nicNodeConfig with the parent's bandwidth entry's
// rates as YAML lines (indented as "    egress: 1G").
func nicNodeConfigAt(parent, rates, pool, cidr, gateway, extra string) string {
	return fmt.Sprintf(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: ["%s"]
  includeVirtual: true
  bandwidth:
  - interface: "%s"
%s  pools:
  - name: %s
    cidr: %s
    gateway: %s
%s`, parent, parent, rates, pool, cidr, gateway, extra)
}

// sharePod is a pod holding a claim of its own name: a bandwidth share of
// parent with capacity, the claim's NetworkConfig netCfg, of the
// DeviceClass class ("" for nic.carve.dev), running image.
type sharePod struct {
	name, parent, netCfg, class, image string
	capacity                           map[resourceapi.QualifiedName]resource.Quantity
	// mutate, when set, changes the pod before it is created.
	mutate func(*corev1.Pod)
}

// start creates the claim and the pod; both are deleted when the test ends.
func (s sharePod) start(t testing.TB, cs kubernetes.Interface) {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: testNS}, Spec: shareClaimSpec(s.parent, s.capacity, s.netCfg)}
	if s.class != "" {
		c.Spec.Devices.Requests[0].Exactly.DeviceClassName = s.class
	}
	if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), s.name, metav1.DeleteOptions{})
	})
	p := podWithImage(s.name, s.image, &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To(s.name)})
	if s.mutate != nil {
		s.mutate(p)
	}
	startPod(t, cs, p)
}

// bothWays is a share's capacity of rate each way.
func bothWays(rate string) map[resourceapi.QualifiedName]resource.Quantity {
	return map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse(rate), "ingressBandwidth": resource.MustParse(rate)}
}

// klogWarnings returns the klog lines of level W or E in logs, the last keep
// of them, or a line saying there were none.
func klogWarnings(logs string, keep int) string {
	var kept []string
	for _, l := range strings.Split(logs, "\n") {
		if len(l) > 1 && (l[0] == 'W' || l[0] == 'E') && l[1] >= '0' && l[1] <= '9' {
			kept = append(kept, l)
		}
	}
	if len(kept) == 0 {
		return "(none)"
	}
	if len(kept) > keep {
		kept = kept[len(kept)-keep:]
	}
	return strings.Join(kept, "\n")
}

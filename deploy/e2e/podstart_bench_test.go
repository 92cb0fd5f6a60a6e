package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const startParent = "carve-e2s0"

// kubeletSteps are the kubelet's own histograms of the steps of a pod's
// start, read before and after each pod (pods start one at a time, so the
// difference is that pod's).
var kubeletSteps = map[string]string{
	"dra-prepare":      `dra_operations_duration_seconds_sum{is_error="false",operation_name="PrepareResources"}`,
	"run-sandbox":      `kubelet_runtime_operations_duration_seconds_sum{operation_type="run_podsandbox"}`,
	"create-container": `kubelet_runtime_operations_duration_seconds_sum{operation_type="create_container"}`,
	"start-container":  `kubelet_runtime_operations_duration_seconds_sum{operation_type="start_container"}`,
}

// BenchmarkPodStart times pods from create to Ready on the real node, in
// rounds of four, one after another (each round begins with the next
// kind): no claim, a claim of the do-nothing
// driver through its template (what DRA costs without carve), a 50M share
// through a claim template, and a 50M share through a pre-created claim. It reports
// the median and p90 of each kind, the median from create to the main
// container's start (taskStarts: without the kubelet's status report),
// and the median time of each kubelet step. At least 20 rounds
// (CARVE_PODSTART_ROUNDS), whatever b.N is.
func BenchmarkPodStart(b *testing.B) {
	cs := client(b)
	env := clusterEnv(b)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	vethParent(b, startParent, "carve-e2s1")
	buildAgentImage(b, "carve:e2e")
	installChart(b, env, stateDir, fmt.Sprintf("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  include: [%q]\n  includeVirtual: true\n  bandwidth:\n  - interface: %q\n    egress: 10G\n", startParent, startParent))
	waitFor(b, "carve's NIC published", 60*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + env["CARVE_NODE_NAME"]})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name == "nic-"+startParent {
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("no nic-%s yet", startParent)
	})
	spec := shareClaimSpec(startParent, map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse("50M")}, "")
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "start-50m", Namespace: testNS}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), "start-50m", metav1.DeleteOptions{})
	})

	rounds := 20
	if n, err := strconv.Atoi(os.Getenv("CARVE_PODSTART_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	// noop: a claim of the do-nothing driver through its template, what
	// DRA costs a pod's start without carve (runNoopNodeDriver).
	runNoopNodeDriver(b, cs, env, 4, nil, nil)
	kinds := []string{"none", "noop", "template", "claim"}
	starts := watchTaskStarts(b, env)
	took := map[string][]float64{}
	running := map[string][]float64{} // create to the container's task start
	steps := map[string][]float64{}
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		for j := range kinds {
			// Each round starts with the next kind, so that no kind
			// always follows the same one's teardown.
			kind := kinds[(i+j)%len(kinds)]
			name := fmt.Sprintf("start-%s-%d", kind, i)
			p := podWithImage(name, "carve-test:latest")
			switch kind {
			case "noop":
				p = podWithImage(name, "carve-test:latest", &corev1.PodResourceClaim{Name: "noop", ResourceClaimTemplateName: ptr.To(noopDriverName)})
			case "template":
				p = podWithImage(name, "carve-test:latest", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("start-50m")})
			case "claim":
				c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: spec}
				if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(ctx, c, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				p = podWithImage(name, "carve-test:latest", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To(name)})
			}
			before := kubeletMetrics(b, cs, env["CARVE_NODE_NAME"])
			created := time.Now()
			d := timePodStart(b, cs, p)
			after := kubeletMetrics(b, cs, env["CARVE_NODE_NAME"])
			took[kind] = append(took[kind], d.Seconds()*1000)
			running[kind] = append(running[kind], starts.of(b, name, "main").Sub(created).Seconds()*1000)
			for step, series := range kubeletSteps {
				steps[kind+"/"+step] = append(steps[kind+"/"+step], (after[series]-before[series])*1000)
			}
			deletePodAndWait(b, cs, name)
			if kind == "claim" {
				_ = cs.ResourceV1().ResourceClaims(testNS).Delete(ctx, name, metav1.DeleteOptions{})
			}
		}
	}
	b.StopTimer()
	for _, kind := range kinds {
		b.ReportMetric(quantile(took[kind], 0.5), kind+"-p50-ms")
		b.ReportMetric(quantile(took[kind], 0.9), kind+"-p90-ms")
	}
	b.ReportMetric(quantile(took["claim"], 0.5)-quantile(took["none"], 0.5), "claim-extra-p50-ms")
	b.ReportMetric(quantile(took["template"], 0.5)-quantile(took["none"], 0.5), "template-extra-p50-ms")
	b.ReportMetric(quantile(took["noop"], 0.5)-quantile(took["none"], 0.5), "noop-extra-p50-ms")
	b.ReportMetric(quantile(took["template"], 0.5)-quantile(took["noop"], 0.5), "template-over-noop-p50-ms")
	// The same, to the container's start (taskStarts).
	for _, kind := range kinds {
		b.ReportMetric(quantile(running[kind], 0.5), kind+"-running-p50-ms")
	}
	b.ReportMetric(quantile(running["template"], 0.5)-quantile(running["none"], 0.5), "template-extra-running-p50-ms")
	b.ReportMetric(quantile(running["noop"], 0.5)-quantile(running["none"], 0.5), "noop-extra-running-p50-ms")
	b.ReportMetric(quantile(running["template"], 0.5)-quantile(running["noop"], 0.5), "template-over-noop-running-p50-ms")
	// Paired by round (the median of each round's difference): the
	// machine's load drifts over a run, and a round's pods start within
	// seconds of each other.
	paired := func(a, c string) float64 {
		var d []float64
		for i := range running[a] {
			d = append(d, running[a][i]-running[c][i])
		}
		return quantile(d, 0.5)
	}
	b.ReportMetric(paired("template", "noop"), "template-over-noop-running-paired-ms")
	b.ReportMetric(paired("noop", "none"), "noop-over-none-running-paired-ms")
	b.ReportMetric(paired("template", "none"), "template-over-none-running-paired-ms")
	var lines []string
	for k, v := range steps {
		lines = append(lines, fmt.Sprintf("%-28s p50 %7.1f ms", k, quantile(v, 0.5)))
	}
	sort.Strings(lines)
	b.Logf("kubelet steps (median per pod):\n%s", strings.Join(lines, "\n"))
}

// timePodStart creates the pod and returns the time until it is Ready.
func timePodStart(b testing.TB, cs kubernetes.Interface, p *corev1.Pod) time.Duration {
	b.Helper()
	start := time.Now()
	if _, err := cs.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cs.CoreV1().Pods(testNS).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	for time.Since(start) < 90*time.Second {
		got, err := cs.CoreV1().Pods(testNS).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return time.Since(start)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatalf("pod %s not Ready in 90s", p.Name)
	return 0
}

func deletePodAndWait(b testing.TB, cs kubernetes.Interface, name string) {
	b.Helper()
	_ = cs.CoreV1().Pods(testNS).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	waitFor(b, "pod "+name+" gone", 60*time.Second, func() (bool, error) {
		_, err := cs.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		return err != nil, nil
	})
}

// kubeletMetrics reads the kubelet's /metrics, through the API server's
// node proxy, into series -> value.
func kubeletMetrics(b testing.TB, cs kubernetes.Interface, node string) map[string]float64 {
	b.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("kubelet metrics: %v", err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

package e2e

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// agentPod is the agent DaemonSet's pod spec in a rendered chart.
func agentPod(t *testing.T, sets ...string) map[string]any {
	t.Helper()
	for _, u := range decodeObjects(t, renderChart(t, sets...)) {
		if u.GetKind() == "DaemonSet" {
			spec, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
			return spec
		}
	}
	t.Fatal("no DaemonSet rendered")
	return nil
}

// What GPU memory shares need of the agent's pod on a real node: the host's
// PID namespace (policing maps NVML's PIDs to pods and kills them), the
// state directory's mounts reaching the host (the MPS shared memory tmpfs
// containers mount), the tmpfs's size. The operator can turn each off.
func TestChartAgentForGPUMemoryShares(t *testing.T) {
	pod := agentPod(t)
	if pod["hostPID"] != true {
		t.Errorf("hostPID = %v, want true by default", pod["hostPID"])
	}
	containers, _, _ := unstructured.NestedSlice(pod, "containers")
	agent := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(agent, "args")
	if !slices.Contains(args, "--mps-shm-size=1Gi") {
		t.Errorf("args %v lack --mps-shm-size", args)
	}
	propagation := func(pod map[string]any) any {
		containers, _, _ := unstructured.NestedSlice(pod, "containers")
		mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
		for _, m := range mounts {
			if m := m.(map[string]any); m["name"] == "state" {
				return m["mountPropagation"]
			}
		}
		return nil
	}
	if got := propagation(pod); got != "Bidirectional" {
		t.Errorf("state volume propagation %v, want Bidirectional", got)
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--nvml-replay") }) {
		t.Errorf("args %v replay NVML by default", args)
	}
	replay := agentPod(t, "nvmlReplayFile=/r/nvml.json", "nvmlReplayProcessesFile=/r/processes.json")
	containers, _, _ = unstructured.NestedSlice(replay, "containers")
	args, _, _ = unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	for _, want := range []string{"--nvml-replay=/host/r/nvml.json", "--nvml-replay-processes=/host/r/processes.json"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	off := agentPod(t, "hostPID=false", "stateDirPropagation=None", "mpsShmSize=256Mi")
	if _, set := off["hostPID"]; set {
		t.Errorf("hostPID=false still renders hostPID: %v", off["hostPID"])
	}
	if got := propagation(off); got != "None" {
		t.Errorf("stateDirPropagation=None renders %v", got)
	}
}

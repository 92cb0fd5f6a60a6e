package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNodeChartDefaultsGPUMemoryTier: the chart with its mount propagation
// defaults runs on this host, whose / is private: the agent is Ready and a
// GPU (a real H100's recorded NVML answers, a fake MPS control binary in a
// driver root made for the test) is published mps-policed, since the init
// container made the state dir shared and the MPS tmpfs shows on the host.
// With stateDirPropagation None the tmpfs cannot show there, and the same
// GPU is published whole-device only (memoryEnforcement none), the agent
// saying why.
func TestNodeChartDefaultsGPUMemoryTier(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	node := env["CARVE_NODE_NAME"]
	clusterDir := filepath.Dir(os.Getenv("CARVE_KUBECONFIG"))
	stateDir := filepath.Join(clusterDir, "carve-state")

	// Under the cluster's directory, which the agent sees under /host.
	dir, err := os.MkdirTemp(clusterDir, "gpu-fixture-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	replay, err := os.ReadFile(filepath.Join(repoRoot(), "gpu", "acceptance", "results", "h100-580-carve-snapshot-nvml.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvml.json"), replay, 0o644); err != nil {
		t.Fatal(err)
	}
	driver := filepath.Join(dir, "driver")
	if err := os.MkdirAll(filepath.Join(driver, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Found, never run: tiers are chosen from what is installed.
	if err := os.WriteFile(filepath.Join(driver, "usr", "bin", "nvidia-cuda-mps-control"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	values := []string{"--set-string", "nvmlReplayFile=" + filepath.Join(dir, "nvml.json"), "--set-string", "nvidiaDriverRoot=" + driver}
	const cfg = "apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"

	buildAgentImage(t, "carve:e2e")
	t.Run("defaults", func(t *testing.T) {
		installChartWith(t, env, stateDir, values, cfg)
		if got := gpuTier(t, cs, node, "mps-policed"); got != "mps-policed" {
			t.Errorf("memoryEnforcement = %q with the chart's defaults, want mps-policed; agent log:\n%s", got, agentLog(t, "enforcement"))
		}
	})
	t.Run("stateDirPropagation=None", func(t *testing.T) {
		installChartWith(t, env, stateDir, append(values, "--set", "stateDirPropagation=None"), cfg)
		if got := gpuTier(t, cs, node, "none"); got != "none" {
			t.Errorf("memoryEnforcement = %q without propagation, want none", got)
		}
		if log := agentLog(t, "enforcement"); !strings.Contains(log, "does not show on the host") {
			t.Errorf("the agent did not say why:\n%s", log)
		}
	})
}

// gpuTier waits for the node's whole GPU to be published with want as its
// memoryEnforcement, and returns what it last saw: the slices of the agent
// installed before may still stand until this one republishes.
func gpuTier(t *testing.T, cs kubernetes.Interface, node, want string) string {
	t.Helper()
	var tier string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		tier = ""
		l, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes["memoryEnforcement"]; ok && a.StringValue != nil {
					tier = *a.StringValue
				}
			}
		}
		if tier == want {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	return tier
}

// agentLog is the agent's log lines that contain what.
func agentLog(t *testing.T, what string) string {
	t.Helper()
	kc := os.Getenv("CARVE_KUBECONFIG")
	kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
	out, _ := execCommand(kubectl, "--kubeconfig", kc, "logs", "-n", chartNamespace, "-l", "app.kubernetes.io/name=carve", "-c", "agent", "--tail=-1").CombinedOutput()
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, what) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

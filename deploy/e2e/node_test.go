package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	testNS       = "default"
	e2eParent    = "carve-e2e0"
	agentMetrics = "29464"
)

// TestNodeEndToEnd deploys carve with its chart onto the cluster's real node
// and runs pods whose claims the real scheduler allocates and the real
// kubelet prepares through carve, checking each pod from inside.
func TestNodeEndToEnd(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	ctx := context.Background()
	node := env["CARVE_NODE_NAME"]
	clusterDir := filepath.Dir(os.Getenv("CARVE_KUBECONFIG"))
	stateDir := filepath.Join(clusterDir, "carve-state")
	cdiDir := env["CARVE_CDI_DIR"]

	// The NIC the shares are cut from: a veth the test makes on the node.
	vethParent(t, e2eParent, "carve-e2e1")

	llc := chooseLLCSource(t, clusterDir)
	buildAgentImage(t, "carve:e2e")
	installChartWith(t, env, stateDir, llc.helmValues(), sharedNICConfig(e2eParent))
	var published []string
	waitFor(t, "carve's slices for "+node, 60*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, err
		}
		published = published[:0]
		nic := false
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				published = append(published, d.Name)
				if d.Name == "nic-"+e2eParent && d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
					nic = true
				}
			}
		}
		return nic && slices.Contains(published, llc.device), fmt.Errorf("%d slices with %v: want a shareable nic-%s and %s", len(l.Items), published, e2eParent, llc.device)
	})
	if llc.mode == "fixture" {
		// The agent must be blind to the host's own caches.
		for _, own := range llc.hostLLCs {
			if own != llc.device && slices.Contains(published, own) {
				t.Errorf("the agent publishes the host's %s although its cache root is the fixture: %v", own, published)
			}
		}
	}

	// A template claim of 100M (pod a) and a claim of 200M (pod b1), both
	// cut from the same NIC: two allocations, two ShareIDs. The cache is
	// one claim shared by pods b1 and b2. (A NIC share is an interface,
	// which only one pod can hold.)
	createTemplate(t, cs, "net-100m", "100M")
	createClaim(t, cs, "net-200m", "200M")
	createLLCClaim(t, cs, "shared-llc")
	pods := map[string]*corev1.Pod{
		"e2e-a":  pod("e2e-a", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("net-100m")}),
		"e2e-b1": pod("e2e-b1", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To("net-200m")}, &corev1.PodResourceClaim{Name: "cache", ResourceClaimName: ptr.To("shared-llc")}),
		"e2e-b2": pod("e2e-b2", &corev1.PodResourceClaim{Name: "cache", ResourceClaimName: ptr.To("shared-llc")}),
	}
	for _, p := range pods {
		startPod(t, cs, p)
	}
	shareOf := map[string]string{}
	for name := range pods {
		waitFor(t, "pod "+name, 90*time.Second, podRunning(cs, testNS, name))
		envs := podExec(t, testNS, name, "main", "env")
		if name != "e2e-a" {
			// The shared cache, seen by both pods.
			if !strings.Contains(envs, "CARVE_CACHE_DEVICE="+llc.device+"\n") || !strings.Contains(envs, "CARVE_CACHE_CPUS=") {
				t.Errorf("pod %s: env lacks the shared LLC:\n%s", name, envs)
			}
		}
		if name == "e2e-b2" {
			continue
		}
		want := map[string]string{"CARVE_NET_PARENT": e2eParent, "CARVE_NET_KIND": "nic", "CARVE_NET_DEVICE": "nic-" + e2eParent}
		want["CARVE_NET_EGRESSBANDWIDTH"] = map[bool]string{true: "100M", false: "200M"}[name == "e2e-a"]
		for k, v := range want {
			if !strings.Contains(envs, k+"="+v+"\n") {
				t.Errorf("pod %s: env lacks %s=%s:\n%s", name, k, v, envs)
			}
		}
		shareOf[name] = envValue(envs, "CARVE_NET_SHARE_ID")
		info := podExec(t, testNS, name, "main", "cat", envValue(envs, "CARVE_NET_INFO"))
		if !strings.Contains(info, shareOf[name]) || !strings.Contains(info, "egressBandwidth") {
			t.Errorf("pod %s: the mounted claim info does not describe its share:\n%s", name, info)
		}
	}
	if shareOf["e2e-a"] == "" || shareOf["e2e-b1"] == "" || shareOf["e2e-a"] == shareOf["e2e-b1"] {
		t.Errorf("share ids %v: want two distinct shares of the NIC", shareOf)
	}

	t.Logf("share ids seen inside the pods: %v", shareOf)

	// The node side: the checkpoint and the metrics.
	before := checkpointRecords(t, stateDir)
	t.Logf("checkpoint: %v", before)
	if len(before) != 3 {
		t.Fatalf("checkpoint holds %d claims, want 3: %v", len(before), before)
	}
	if m := scrapeAgent(t); !strings.Contains(m, "carve_prepared_claims 3") {
		t.Errorf("agent metrics lack carve_prepared_claims 3")
	}

	// Restart the kubelet, then the agent, while the pods run: nothing
	// breaks, nothing is prepared twice, and new pods still start.
	restartKubelet(t)
	waitFor(t, "the node Ready after the kubelet restart", 60*time.Second, nodeReady(cs, node))
	startPod(t, cs, pod("e2e-c", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("net-100m")}))
	waitFor(t, "a new pod after the kubelet restart", 90*time.Second, podRunning(cs, testNS, "e2e-c"))
	restartAgent(t, cs)
	startPod(t, cs, pod("e2e-d", &corev1.PodResourceClaim{Name: "net", ResourceClaimTemplateName: ptr.To("net-100m")}))
	waitFor(t, "a new pod after the agent restart", 90*time.Second, podRunning(cs, testNS, "e2e-d"))
	for name := range pods {
		if ok, err := podRunning(cs, testNS, name)(); !ok {
			t.Errorf("pod %s broke across the restarts: %v", name, err)
		}
	}
	after := checkpointRecords(t, stateDir)
	for uid, updated := range before {
		if after[uid] != updated {
			t.Errorf("claim %s was prepared again across the restarts (record written %s, then %s)", uid, updated, after[uid])
		}
	}

	// Deleting the pods unprepares their claims and leaves nothing behind.
	for _, name := range []string{"e2e-a", "e2e-b1", "e2e-b2", "e2e-c", "e2e-d"} {
		_ = cs.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}
	waitFor(t, "every claim unprepared", 90*time.Second, func() (bool, error) {
		recs := checkpointRecords(t, stateDir)
		specs, _ := filepath.Glob(filepath.Join(cdiDir, "carve.dev-claim_*"))
		infos, _ := filepath.Glob(filepath.Join(stateDir, "claims", "*.json"))
		return len(recs) == 0 && len(specs) == 0 && len(infos) == 0, fmt.Errorf("records %v, CDI specs %v, claim files %v", recs, specs, infos)
	})
	if m := scrapeAgent(t); !strings.Contains(m, "carve_prepared_claims 0") {
		t.Errorf("agent metrics do not show 0 prepared claims")
	}
}

func runQuiet(name string, args ...string) error {
	return execCommand(name, args...).Run()
}

func envValue(envs, key string) string {
	for _, l := range strings.Split(envs, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	return ""
}

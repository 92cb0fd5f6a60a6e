package e2e

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartUninstallHookTolerations: the agents tolerate every taint (they
// must run on every node), the uninstall hook's pod none unless given its
// own: with the agents' blanket toleration it could be placed on a node
// that is down or cordoned (node.kubernetes.io/unreachable, unschedulable),
// never run there, and hold `helm uninstall` until its timeout.
func TestChartUninstallHookTolerations(t *testing.T) {
	tolerations := func(sets ...string) (agent, hook []any) {
		t.Helper()
		for _, u := range decodeObjects(t, renderChart(t, sets...)) {
			tol, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "tolerations")
			switch {
			case u.GetKind() == "DaemonSet" && u.GetName() == "carve-agent":
				agent = tol
			case u.GetKind() == "Job" && u.GetName() == "carve-uninstall-check":
				hook = tol
			}
		}
		return agent, hook
	}
	agent, hook := tolerations()
	if len(agent) != 1 || agent[0].(map[string]any)["operator"] != "Exists" {
		t.Errorf("the agents' tolerations by default: %v, want every taint tolerated", agent)
	}
	if len(hook) != 0 {
		t.Errorf("the uninstall hook's tolerations by default: %v, want none", hook)
	}
	_, hook = tolerations("uninstall.tolerations[0].key=dedicated", "uninstall.tolerations[0].operator=Exists", "uninstall.tolerations[0].effect=NoSchedule")
	if len(hook) != 1 || hook[0].(map[string]any)["key"] != "dedicated" {
		t.Errorf("the uninstall hook's tolerations with uninstall.tolerations set: %v, want those", hook)
	}
}

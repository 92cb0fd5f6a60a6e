package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The agent's role lets it record the policing loop's kill events (core
// Events, created, then patched when they repeat): without it each kill
// logged a 403. Read from the committed manifests, which
// TestManifestsMatchChart holds to the chart; no cluster needed.
func TestAgentMayRecordEvents(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy/manifests/carve.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatalf("manifest document: %v", err)
		}
		if r.Kind == "ClusterRole" && r.Name == "carve-agent" {
			role = &r
		}
	}
	if role == nil {
		t.Fatal("no ClusterRole carve-agent in deploy/manifests/carve.yaml")
	}
	for _, verb := range []string{"create", "patch"} {
		ok := false
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "events") && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0 {
				ok = true
			}
		}
		if !ok {
			t.Errorf("carve-agent may not %s core events: rules %+v", verb, role.Rules)
		}
	}
}

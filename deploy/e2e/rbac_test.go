package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/prepare/status"
)

// checkClaimStatusRights: node A's agent may write its driver's entries of
// status.devices on a claim allocated on node A, with a patch, and nothing
// else: no whole-status update, no change of the allocation, no entries of
// another driver, no claim of node B.
func checkClaimStatusRights(t testing.TB, admin, agent kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	claim := func(name, node string) *resourceapi.ResourceClaim { return allocatedClaim(t, admin, name, node) }
	own := claim("rbac-node-a", "policy-node-a")
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "carve.dev", own, statusEntry("carve.dev", "policy-node-a")); err != nil {
		t.Errorf("node A's agent patching its entries on a claim of node A: %v", err)
	}
	got, _ := admin.ResourceV1().ResourceClaims("default").Get(ctx, own.Name, metav1.GetOptions{})
	got.Status.Devices = statusEntry("carve.dev", "policy-node-a")
	if _, err := agent.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, got, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node A's agent updating a claim's whole status: %v; want forbidden", err)
	}
	got.Status.Allocation = nil
	if _, err := agent.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, got, metav1.UpdateOptions{}); err == nil {
		t.Error("node A's agent dropped a claim's allocation; want it denied")
	}
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "other.example.com", own, statusEntry("other.example.com", "policy-node-a")); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("node A's agent writing another driver's entries: %v; want forbidden", err)
	}
	other := claim("rbac-node-b", "policy-node-b")
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "carve.dev", other, statusEntry("carve.dev", "policy-node-b")); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("node A's agent writing a claim of node B: %v; want forbidden", err)
	}
}

// allocatedClaim is a claim in default allocated (by the admin, as the
// scheduler would) a device of node's pool, on node.
func allocatedClaim(t testing.TB, admin kubernetes.Interface, name, node string) *resourceapi.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "net", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "rbac-test"}}}}}}
	created, err := admin.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.ResourceV1().ResourceClaims("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	created.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "net", Driver: "carve.dev", Pool: node, Device: "nic-x"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	created, err = admin.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate %s: %v", name, err)
	}
	return created
}

func statusEntry(driver, pool string) []resourceapi.AllocatedDeviceStatus {
	return []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: pool, Device: "nic-x",
		NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1"}}}
}

// A second node's agent, its token bound to node B, reaches nothing of node
// A's: not A's pool (even in a slice naming B), not another driver's slices
// (even of its own node and pool), not the status of a claim allocated on A.
// Each write is tried beside the same write by the right agent, which must
// land, so that a refusal for another reason cannot pass.
func TestSecondNodeAgentConfinedToItsNode(t *testing.T) {
	env := setupNodeBound(t)
	ctx := context.Background()
	admin := env.admin
	agentA := env.agentOn(t, "policy-node-a")
	agentB := env.agentOn(t, "policy-node-b")
	waitForPolicy(t, agentB, "policy-node-a")
	slicesOf := func(agent kubernetes.Interface) func(*resourceapi.ResourceSlice) error {
		return func(s *resourceapi.ResourceSlice) error {
			_, err := agent.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
			if err == nil {
				t.Cleanup(func() {
					_ = admin.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
				})
			}
			return err
		}
	}
	createA, createB := slicesOf(agentA), slicesOf(agentB)
	// refused: err is the API server's refusal saying want. The policy's
	// are 403 Forbidden; the API server's own status check is a 422 whose
	// field error says Forbidden.
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed; want refused (%q)", what, want)
			return
		}
		if !strings.Contains(err.Error(), want) || (strings.HasPrefix(want, "the carve agent") && !apierrors.IsForbidden(err)) ||
			!strings.Contains(strings.ToLower(err.Error()), "forbidden") {
			t.Errorf("%s: %v; want forbidden, %q", what, err, want)
			return
		}
		t.Logf("%s: refused: %v", what, err)
	}

	// The legitimate writes: each agent its own node's pool.
	if err := createA(policySlice("policy-a", "policy-node-a", "policy-node-a", "carve.dev")); err != nil {
		t.Fatalf("node A's agent writing node A's slice: %v", err)
	}
	if err := createB(policySlice("policy-b", "policy-node-b", "policy-node-b", "carve.dev")); err != nil {
		t.Fatalf("node B's agent writing node B's slice: %v", err)
	}

	// (a) Node A's pool, from node B: in a slice of node B (shadowing A's
	// pool), in a slice of node A, and A's own slice changed or deleted.
	refused("node B's agent writing a slice of node B in node A's pool",
		createB(policySlice("policy-b-shadows-a", "policy-node-b", "policy-node-a", "carve.dev")),
		"the carve agent on node policy-node-b may not modify ResourceSlices of pool policy-node-a")
	refused("node B's agent writing a slice of node A",
		createB(policySlice("policy-b-writes-a", "policy-node-a", "policy-node-a", "carve.dev")),
		"the carve agent on node policy-node-b may not modify ResourceSlices of node policy-node-a")
	own, err := admin.ResourceV1().ResourceSlices().Get(ctx, "policy-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own.Spec.Pool.Generation++
	_, err = agentB.ResourceV1().ResourceSlices().Update(ctx, own, metav1.UpdateOptions{})
	refused("node B's agent updating node A's slice", err,
		"the carve agent on node policy-node-b may not modify ResourceSlices of node policy-node-a")
	refused("node B's agent deleting node A's slice",
		agentB.ResourceV1().ResourceSlices().Delete(ctx, "policy-a", metav1.DeleteOptions{}),
		"the carve agent on node policy-node-b may not modify ResourceSlices of node policy-node-a")
	if _, err := agentA.ResourceV1().ResourceSlices().Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Errorf("node A's agent updating its own slice: %v", err)
	}

	// (b) Another driver's slice, of node B's own node and pool.
	refused("node B's agent writing another driver's slice",
		createB(policySlice("policy-b-other-driver", "policy-node-b", "policy-node-b", "other.example.com")),
		"the carve agent on node policy-node-b may not modify ResourceSlices of driver other.example.com, only those of carve.dev")

	// (c) The status of a claim allocated on node A, from node B: the API
	// server's own check (Kubernetes >= 1.36, the chart's kubeVersion).
	claimA := allocatedClaim(t, admin, "policy-claim-a", "policy-node-a")
	claimB := allocatedClaim(t, admin, "policy-claim-b", "policy-node-b")
	err = status.ClaimStatusWriter{Client: agentB}.ReportDevices(ctx, "carve.dev", claimA, statusEntry("carve.dev", "policy-node-a"))
	refused("node B's agent writing the status of a claim allocated on node A", err, `requires resource="resourceclaims/driver"`)
	if err := (status.ClaimStatusWriter{Client: agentB}).ReportDevices(ctx, "carve.dev", claimB, statusEntry("carve.dev", "policy-node-b")); err != nil {
		t.Errorf("node B's agent writing the status of a claim allocated on node B: %v", err)
	}
	if err := (status.ClaimStatusWriter{Client: agentA}).ReportDevices(ctx, "carve.dev", claimA, statusEntry("carve.dev", "policy-node-a")); err != nil {
		t.Errorf("node A's agent writing the status of a claim allocated on node A: %v", err)
	}
	got, err := admin.ResourceV1().ResourceClaims("default").Get(ctx, claimA.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Pool != "policy-node-a" {
		t.Errorf("claim A's status.devices %+v; want node A's agent's entry only", got.Status.Devices)
	}
}

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
	claim := func(name, node string) *resourceapi.ResourceClaim {
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
	entry := func(driver, pool string) []resourceapi.AllocatedDeviceStatus {
		return []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: pool, Device: "nic-x",
			NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1"}}}
	}
	own := claim("rbac-node-a", "policy-node-a")
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "carve.dev", own, entry("carve.dev", "policy-node-a")); err != nil {
		t.Errorf("node A's agent patching its entries on a claim of node A: %v", err)
	}
	got, _ := admin.ResourceV1().ResourceClaims("default").Get(ctx, own.Name, metav1.GetOptions{})
	got.Status.Devices = entry("carve.dev", "policy-node-a")
	if _, err := agent.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, got, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node A's agent updating a claim's whole status: %v; want forbidden", err)
	}
	got.Status.Allocation = nil
	if _, err := agent.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, got, metav1.UpdateOptions{}); err == nil {
		t.Error("node A's agent dropped a claim's allocation; want it denied")
	}
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "other.example.com", own, entry("other.example.com", "policy-node-a")); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("node A's agent writing another driver's entries: %v; want forbidden", err)
	}
	other := claim("rbac-node-b", "policy-node-b")
	if err := (status.ClaimStatusWriter{Client: agent}).ReportDevices(ctx, "carve.dev", other, entry("carve.dev", "policy-node-b")); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("node A's agent writing a claim of node B: %v; want forbidden", err)
	}
}

package status

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// A claim prepared again (every claim of the node, after a kubelet restart)
// whose status holds this driver's entries already is not patched; one whose
// entries differ, or hold another driver's only, is, and the other driver's
// entry stays.
func TestReportDevicesPatchesOnlyAChange(t *testing.T) {
	ours := resourceapi.AllocatedDeviceStatus{Driver: "carve.dev", Pool: "node-1", Device: "nic-0", ShareID: ptr.To("s-1"),
		NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1", HardwareAddress: "02:ca:7e:00:00:01"}}
	other := resourceapi.AllocatedDeviceStatus{Driver: "gpu.example.com", Pool: "node-1", Device: "gpu-0"}
	moved := ours
	moved.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: "net2", HardwareAddress: "02:ca:7e:00:00:01"}
	for _, c := range []struct {
		name      string
		status    []resourceapi.AllocatedDeviceStatus
		wantPatch bool
	}{
		{"empty status", nil, true},
		{"another driver's entry only", []resourceapi.AllocatedDeviceStatus{other}, true},
		{"ours, changed", []resourceapi.AllocatedDeviceStatus{moved, other}, true},
		{"ours already, beside another driver's", []resourceapi.AllocatedDeviceStatus{other, ours}, false},
		{"ours already", []resourceapi.AllocatedDeviceStatus{ours}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "uid-c", ResourceVersion: "7"},
				Status: resourceapi.ResourceClaimStatus{Devices: c.status}}
			cs := fake.NewClientset(claim.DeepCopy())
			if err := (ClaimStatusWriter{Client: cs}).ReportDevices(context.Background(), "carve.dev", claim, []resourceapi.AllocatedDeviceStatus{ours}); err != nil {
				t.Fatal(err)
			}
			patches := 0
			for _, a := range cs.Actions() {
				if a.GetVerb() == "patch" {
					patches++
				}
			}
			if got := patches > 0; got != c.wantPatch {
				t.Fatalf("patched %d times, want a patch: %v", patches, c.wantPatch)
			}
			got, err := cs.ResourceV1().ResourceClaims("ns").Get(context.Background(), "c", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !sameEntries(got.Status.Devices, mergeDeviceStatus(c.status, []resourceapi.AllocatedDeviceStatus{ours})) {
				t.Errorf("status after the report: %+v", got.Status.Devices)
			}
		})
	}
}

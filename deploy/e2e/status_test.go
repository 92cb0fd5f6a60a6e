package e2e

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-dra/carve/prepare/status"
)

// The network data of a prepared share lands in the claim's status.devices,
// as the API server validates it (KEP-4817).
func TestClaimStatusNetworkData(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	ref := makeClaim(t, cs, "status-node", "status-claim", alloc{request: "net", device: "nic-x", share: true, egress: "10M"})
	claim, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	share := claim.Status.Allocation.Devices.Results[0].ShareID
	entries := []resourceapi.AllocatedDeviceStatus{{Driver: "carve.dev", Pool: "status-node", Device: "nic-x", ShareID: (*string)(share),
		NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.79.0.2/24"}, HardwareAddress: "02:00:00:00:00:01"}}}
	if err := (status.ClaimStatusWriter{Client: cs}).ReportDevices(ctx, "carve.dev", claim, entries); err != nil {
		t.Fatalf("report: %v", err)
	}
	got, _ := cs.ResourceV1().ResourceClaims("default").Get(ctx, ref.Name, metav1.GetOptions{})
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].NetworkData == nil || got.Status.Devices[0].NetworkData.InterfaceName != "net1" {
		t.Errorf("status.devices = %+v", got.Status.Devices)
	}
}

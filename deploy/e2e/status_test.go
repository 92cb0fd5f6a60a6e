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

// A claim handed over stale (the claim's other device reported after it
// was read) costs a conflict, a read and a retry, and both entries stand:
// the patch is guarded by the handed claim's resourceVersion.
func TestClaimStatusFromAStaleClaimKeepsTheOtherEntries(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	ref := makeClaim(t, cs, "status-node", "status-stale",
		alloc{request: "net", device: "nic-x", share: true, egress: "10M"}, alloc{request: "net2", device: "nic-y", share: true, egress: "10M"})
	claims := cs.ResourceV1().ResourceClaims("default")
	stale, err := claims.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	entry := func(i int, name string) []resourceapi.AllocatedDeviceStatus {
		r := stale.Status.Allocation.Devices.Results[i]
		return []resourceapi.AllocatedDeviceStatus{{Driver: "carve.dev", Pool: r.Pool, Device: r.Device, ShareID: (*string)(r.ShareID),
			NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: name}}}
	}
	w := status.ClaimStatusWriter{Client: cs}
	if err := w.ReportDevices(ctx, "carve.dev", stale, entry(1, "net2")); err != nil {
		t.Fatalf("the second device's report: %v", err)
	}
	if err := w.ReportDevices(ctx, "carve.dev", stale, entry(0, "net1")); err != nil {
		t.Fatalf("the first device's report, from the stale claim: %v", err)
	}
	got, err := claims.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, d := range got.Status.Devices {
		if d.NetworkData != nil {
			names[d.Device] = d.NetworkData.InterfaceName
		}
	}
	if len(got.Status.Devices) != 2 || names["nic-x"] != "net1" || names["nic-y"] != "net2" {
		t.Errorf("status.devices = %+v, want both devices' entries", got.Status.Devices)
	}
}

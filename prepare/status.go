package prepare

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
)

// StatusWriter reports prepared devices in a claim's status.
type StatusWriter interface {
	ReportDevices(ctx context.Context, driver string, claim *resourceapi.ResourceClaim, devices []PreparedDevice) error
}

// ClaimStatusWriter writes status.devices with server-side apply, as field
// manager "<driver>": the list is keyed by driver, pool, device and share,
// so each driver (and each share) owns its own entries.
type ClaimStatusWriter struct {
	Client kubernetes.Interface
}

func (w ClaimStatusWriter) ReportDevices(ctx context.Context, driver string, claim *resourceapi.ResourceClaim, devices []PreparedDevice) error {
	status := resourceapply.ResourceClaimStatus()
	n := 0
	for _, d := range devices {
		if d.Network == nil {
			continue
		}
		nd := resourceapply.NetworkDeviceData().WithInterfaceName(d.Network.InterfaceName).
			WithIPs(d.Network.IPs...).WithHardwareAddress(d.Network.HardwareAddress)
		ds := resourceapply.AllocatedDeviceStatus().WithDriver(driver).WithPool(d.Pool).WithDevice(d.Device).WithNetworkData(nd)
		if d.ShareID != nil {
			ds = ds.WithShareID(string(*d.ShareID))
		}
		status = status.WithDevices(ds)
		n++
	}
	if n == 0 {
		return nil
	}
	apply := resourceapply.ResourceClaim(claim.Name, claim.Namespace).WithStatus(status)
	_, err := w.Client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: driver, Force: true})
	if err != nil {
		return fmt.Errorf("apply status of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return nil
}

// Package status reports prepared network devices in a ResourceClaim's
// status.devices (KEP-4817), leaving other drivers' entries alone.
package status

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Writer reports a driver's device entries in a claim's status.
type Writer interface {
	ReportDevices(ctx context.Context, driver string, claim *resourceapi.ResourceClaim, entries []resourceapi.AllocatedDeviceStatus) error
}

// ClaimStatusWriter writes this driver's entries of status.devices: merge,
// then a merge patch of status.devices alone, guarded by the
// resourceVersion of the claim it was handed (the one the kubelet plugin
// helper has just read to prepare it), and on conflict read again, merged
// and retried. Reading the claim first again doubled the agent's API
// requests per pod, and its status writes share the API server with every
// prepare's read of its claim (issue 44). A patch, not UpdateStatus: an
// update sends the whole object back, and a client older than the API
// server would drop the fields it does not know. (A server-side apply of
// status would send an empty status.allocation, which the API server takes
// for a change of the allocation and refuses.)
type ClaimStatusWriter struct {
	Client kubernetes.Interface
}

var _ Writer = ClaimStatusWriter{}

// ReportDevices replaces the driver's entries that match entries (same
// pool, device and share) and keeps all others.
func (w ClaimStatusWriter) ReportDevices(ctx context.Context, driver string, claim *resourceapi.ResourceClaim, entries []resourceapi.AllocatedDeviceStatus) error {
	if len(entries) == 0 {
		return nil
	}
	claims := w.Client.ResourceV1().ResourceClaims(claim.Namespace)
	handed := claim.ResourceVersion != ""
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current := claim
		if !handed {
			var err error
			if current, err = claims.Get(ctx, claim.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		handed = false // a conflict: read it again
		if current.UID != claim.UID {
			return fmt.Errorf("claim was replaced")
		}
		merged := mergeDeviceStatus(current.Status.Devices, entries)
		if sameEntries(current.Status.Devices, merged) {
			// Prepared again (a kubelet restart re-prepares every
			// claim of the node): the status says it already, and a
			// patch that changes nothing still costs the API server
			// its decoding, validation and managed fields.
			return nil
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": current.ResourceVersion},
			"status":   map[string]any{"devices": merged},
		})
		if err != nil {
			return err
		}
		_, err = claims.Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: driver}, "status")
		return err
	})
	if err != nil {
		return fmt.Errorf("update status of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return nil
}

// sameEntries says whether a and b hold the same entries, in any order.
func sameEntries(a, b []resourceapi.AllocatedDeviceStatus) bool {
	if len(a) != len(b) {
		return false
	}
	used := make([]bool, len(b))
next:
	for i := range a {
		for j := range b {
			if !used[j] && equality.Semantic.DeepEqual(a[i], b[j]) {
				used[j] = true
				continue next
			}
		}
		return false
	}
	return true
}

// mergeDeviceStatus replaces the entries with the same driver, pool, device
// and share, and keeps every other entry (other drivers' among them).
func mergeDeviceStatus(current, ours []resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus {
	same := func(a, b resourceapi.AllocatedDeviceStatus) bool {
		return a.Driver == b.Driver && a.Pool == b.Pool && a.Device == b.Device && ptr.Deref(a.ShareID, "") == ptr.Deref(b.ShareID, "")
	}
	out := append([]resourceapi.AllocatedDeviceStatus(nil), ours...)
	for _, c := range current {
		replaced := false
		for _, o := range ours {
			if same(c, o) {
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, c)
		}
	}
	return out
}

package prepare

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
)

// benchRecord is a completed network share's record as the agent writes it:
// allocation, effective config, the NIC preparer's undo record, the answer
// to the kubelet and the network status.
func benchRecord(i int) ClaimRecord {
	uid := uuid.NewUUID()
	share := ptr.To(types.UID(uuid.NewUUID()))
	a := Allocation{ClaimUID: uid, ClaimNamespace: "default", ClaimName: fmt.Sprintf("claim-%d", i), Request: "net", Pool: "node-1",
		Device: "nic-0000-17-00-0", Kind: "nic", ShareID: share,
		Consumed: map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse("10M"), "ingressBandwidth": resource.MustParse("10M"), "shares": resource.MustParse("1")},
		Config:   json.RawMessage(`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","network":{"interfaceName":"net1","macvlanMode":"vepa"}}`)}
	undo := json.RawMessage(fmt.Sprintf(`{"parent":"ens1f0np0","link":"cv%08x","mac":"02:ca:7e:%02x:%02x:%02x","egressMinor":%d,"ingressMinor":%d}`, i, i>>16&0xff, i>>8&0xff, i&0xff, 16+16*i, 16+16*i))
	return ClaimRecord{UID: uid, Namespace: "default", Name: a.ClaimName, State: ClaimCompleted, Allocations: []Allocation{a}, Undo: []json.RawMessage{undo},
		Devices: []PreparedDevice{{Request: "net", Pool: "node-1", Device: a.Device, ShareID: share,
			CDIDeviceIDs: []string{fmt.Sprintf("carve.dev/claim=%s-net-nic-0000-17-00-0-%s", uid, *share)},
			Network:      &resourceapi.NetworkDeviceData{InterfaceName: "net1", HardwareAddress: "02:ca:7e:00:00:01"}}},
		CDISpec: fmt.Sprintf("carve.dev-claim_%s.json", uid), Updated: time.Now().UTC()}
}

// BenchmarkCheckpointHeld is one claim's record added and removed (a
// prepare's two updates and an unprepare's one) with N other claims held.
func BenchmarkCheckpointHeld(b *testing.B) {
	for _, held := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("held-%d", held), func(b *testing.B) {
			c, err := OpenCheckpoint(b.TempDir(), "boot", nil)
			if err != nil {
				b.Fatal(err)
			}
			var size int
			c.OnWrite(func(n int, _ time.Duration) { size = n })
			if err := c.Update(func(recs *Records) error {
				for i := range held {
					r := benchRecord(i)
					recs.Set(r.UID, r)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			one := benchRecord(held)
			for b.Loop() {
				for _, fn := range []func(*Records) error{
					func(recs *Records) error { r := one; r.State = ClaimStarted; recs.Set(r.UID, r); return nil },
					func(recs *Records) error { recs.Set(one.UID, one); return nil },
					func(recs *Records) error { recs.Delete(one.UID); return nil },
				} {
					if err := c.Update(fn); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(size)/1024, "KiB")
		})
	}
}

package status

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

const ourDriver = "carve.dev"

// statusList builds entries from bytes, four an entry: the driver (ours,
// another, or "" which the API server would refuse), pool, device and
// share (none, "", or one of two), each from a small alphabet so that
// entries collide. Each entry has NetworkData of its own, by which the test
// tells an entry from an equal one.
func statusList(b []byte, onlyOurs bool) []resourceapi.AllocatedDeviceStatus {
	drivers := []string{ourDriver, "gpu.example.com", ""}
	var out []resourceapi.AllocatedDeviceStatus
	for i := 0; i+4 <= len(b) && len(out) < 64; i += 4 {
		e := resourceapi.AllocatedDeviceStatus{
			Driver: drivers[int(b[i])%len(drivers)],
			Pool:   fmt.Sprintf("pool-%d", b[i+1]%3),
			Device: fmt.Sprintf("dev-%d", b[i+2]%4),
		}
		if onlyOurs {
			e.Driver = ourDriver
		}
		switch b[i+3] % 4 {
		case 1:
			e.ShareID = ptr.To("")
		case 2, 3:
			e.ShareID = ptr.To(fmt.Sprintf("share-%d", b[i+3]%4))
		}
		e.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: fmt.Sprintf("n%d", i/4)}
		out = append(out, e)
	}
	return out
}

type statusKey struct{ driver, pool, device, share string }

func keyOf(e resourceapi.AllocatedDeviceStatus) statusKey {
	return statusKey{e.Driver, e.Pool, e.Device, ptr.Deref(e.ShareID, "")}
}

// FuzzMergeDeviceStatus merges this driver's entries into a claim's
// status.devices, which other drivers (and the API server's other writers)
// also fill. Ours come first and are all there, as given; every current
// entry that none of ours replaces is kept, in order, whoever wrote it; and
// no entry of ours appears twice.
func FuzzMergeDeviceStatus(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 2}, []byte{0, 0, 0, 0, 0, 1, 1, 3})
	f.Add([]byte{}, []byte{0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x80}, []byte{0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0}, []byte{})
	f.Add([]byte{0, 0, 0, 2, 0, 0, 0, 3}, []byte{0, 0, 0, 2, 0, 0, 0, 2})
	f.Fuzz(func(t *testing.T, currentBytes, oursBytes []byte) {
		current, ours := statusList(currentBytes, false), statusList(oursBytes, true)
		oursUnique := true
		seen := map[statusKey]bool{}
		for _, o := range ours {
			if seen[keyOf(o)] {
				oursUnique = false
			}
			seen[keyOf(o)] = true
		}
		out := mergeDeviceStatus(current, ours)
		if len(out) < len(ours) {
			t.Fatalf("merged %d entries, fewer than our %d", len(out), len(ours))
		}
		for i, o := range ours {
			if out[i].NetworkData != o.NetworkData || keyOf(out[i]) != keyOf(o) {
				t.Fatalf("entry %d is not ours as given: %+v", i, out[i])
			}
		}
		rest := out[len(ours):]
		j := 0
		for _, c := range current {
			if seen[keyOf(c)] {
				continue // replaced by ours
			}
			if j >= len(rest) || rest[j].NetworkData != c.NetworkData {
				t.Fatalf("current entry %+v (not ours) was dropped or moved", c)
			}
			j++
		}
		if j != len(rest) {
			t.Fatalf("%d entries come from neither list", len(rest)-j)
		}
		for _, r := range rest {
			if seen[keyOf(r)] {
				t.Fatalf("a current entry %+v survives beside ours", r)
			}
		}
		if oursUnique {
			got := map[statusKey]int{}
			for _, e := range out {
				if e.Driver == ourDriver {
					if got[keyOf(e)]++; got[keyOf(e)] > 1 && seen[keyOf(e)] {
						t.Fatalf("our entry %+v appears twice", keyOf(e))
					}
				}
			}
		}
	})
}

package netdev_test

import (
	"context"
	"net"
	"testing"

	"github.com/carve-dra/carve/bpf"
)

// A prepare that fails after a share's class is made, here because the
// classifier's map is full when the ingress entry is added, must not leave
// the class behind. The undo used to learn a class's minor only from the
// classifier entry, which a failed step never wrote: the IFB then kept an
// ingress class that nothing named, and was never removed (the orphaned
// class once seen in CI's TestNodeNetworkShares).
func TestFailedPrepareLeavesNoClass(t *testing.T) {
	b := newBench(t)
	// Fill the classifier's share map but for one entry: the egress
	// entry takes it, the ingress entry finds the map full.
	var filler []net.HardwareAddr
	capacity := b.shaper.ShareCapacity()
	for i := 0; i < capacity-1; i++ {
		mac := net.HardwareAddr{0x02, 0xfe, 0, byte(i >> 16), byte(i >> 8), byte(i)}
		if err := b.shaper.SetShare(bpf.Egress, mac, 0x10001); err != nil {
			t.Fatalf("fill entry %d of %d: %v", i, capacity, err)
		}
		filler = append(filler, mac)
	}
	t.Cleanup(func() {
		for _, mac := range filler {
			_ = b.shaper.DeleteShare(bpf.Egress, mac)
		}
	})
	a := b.alloc("full", "100M", "100M")
	_, err := b.p.Prepare(context.Background(), a, b.dev)
	if err == nil {
		t.Fatal("prepare succeeded with the classifier's map full")
	}
	t.Logf("prepare failed as it should: %v", err)
	b.checkParentClean(t)
}

package bpf

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/carve-dra/carve/bpf/nettest"
)

// flowSlots is FLOW_SLOTS (bpf/flows.h).
const flowSlots = len(shaperShareFlowset{}.Slots)

// flowIdle is FLOW_IDLE_NS (bpf/flows.h).
const flowIdle = 100 * time.Millisecond

// A flow-isolated share keeps its first flows in its own entry's slots and
// the rest in share_flows: every flow is in exactly one of them, keeps its
// bulk child from frame to frame wherever it is, and the first eight bulk
// flows get eight children. Forty flows are more than the sixteen slots;
// once the first forty have been idle for FLOW_IDLE_NS, new flows take
// their slots.
func TestFlowSlots(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const class = 0x10010
	if err := s.SetShare(Egress, mac1, class); err != nil {
		t.Fatal(err)
	}
	// A flow turns bulk where its clock, at 1/FLOW_SPARSE_DIV of the
	// share's rate, runs two full frames ahead of now. At 2 Mbit/s a full
	// frame is 97 ms on that clock, so four frames are bulk unless the
	// four runs take 190 ms: at 100 Mbit/s they had 3.9 ms, and a guest
	// of make vmtest (6.1, emulated) took longer once.
	const bitsPerSec = 2e6
	frameClock := time.Duration(1514 * 8 * FlowSparseDiv * float64(time.Second) / bitsPerSec)
	if err := s.SetShareQueue(Egress, mac1, ShareQueue{BitsPerSec: bitsPerSec, ClassIfindex: 7, Minor: 0x10}); err != nil {
		t.Fatal(err)
	}
	frame := func(src string) []byte {
		f := make([]byte, 1514) // two of them turn a flow bulk
		copy(f, ipFrame(mac2, mac1, src, "10.9.0.1", false))
		return f
	}
	send := func(src string, repeat uint32) uint32 {
		t.Helper()
		var out skbCtx
		ret, err := s.objs.ClassifyEgress.Run(&ebpf.RunOptions{Data: frame(src), Context: skbCtx{}, ContextOut: &out, Repeat: repeat})
		nettest.SkipIfLacks(t, err, nettest.BPF("BPF_PROG_RUN"))
		if err != nil || int32(ret) != -1 {
			t.Fatalf("flow %s: returned %d, %v; want TCX_NEXT (-1)", src, int32(ret), err)
		}
		return out.Priority
	}
	const flows = 40
	first := make([]uint32, flows)
	for i := range flows {
		src := fmt.Sprintf("10.9.1.%d", i+1)
		first[i] = send(src, 4)
		if first[i] < class+FlowBulkFirst || first[i] >= class+FlowBulkFirst+FlowBulkChildren {
			t.Fatalf("flow %s: class %#x after four full frames, want a bulk child of %#x", src, first[i], class)
		}
	}
	seen := map[uint32]bool{}
	for _, p := range first[:FlowBulkChildren] {
		seen[p] = true
	}
	if len(seen) != FlowBulkChildren {
		t.Errorf("the first %d bulk flows got %d children (%#x), want one each", FlowBulkChildren, len(seen), first[:FlowBulkChildren])
	}
	for i := range flows {
		if p := send(fmt.Sprintf("10.9.1.%d", i+1), 2); p != first[i] {
			t.Errorf("flow %d moved from child %#x to %#x", i, first[i], p)
		}
	}
	slots, flowsInMap := s.flowSlots(t, mac1)
	slotted, inMap := map[uint32]bool{}, len(flowsInMap)
	for _, h := range slots {
		if h != 0 {
			slotted[h] = true
		}
	}
	t.Logf("%d flows: %d in the share's slots, %d in share_flows", flows, len(slotted), inMap)
	if len(slotted)+inMap != flows {
		t.Errorf("%d flows in slots and %d in share_flows, want %d in all: each in one place", len(slotted), inMap, flows)
	}
	if len(slotted) < FlowBulkChildren {
		t.Errorf("only %d of %d flows in the share's slots, want at least %d", len(slotted), flows, FlowBulkChildren)
	}

	// Once the first forty are idle, a new flow takes one of its two
	// slots (by its hash) wherever an idle flow holds it: one found in
	// share_flows has two slots that other new flows took first. (Not
	// every idle flow's slot need be taken: forty hashes can leave one
	// out, as the per-boot hash seed decides; 6.1 in make vmtest did.)
	// Six frames each put a flow's clock six frame times ahead; idle is
	// FLOW_IDLE_NS past that.
	_, before := s.flowSlots(t, mac1)
	time.Sleep(6*frameClock + flowIdle + 50*time.Millisecond)
	for i := range flows {
		send(fmt.Sprintf("10.9.2.%d", i+1), 4)
	}
	slots, after := s.flowSlots(t, mac1)
	taken := 0
	for _, h := range slots {
		if h != 0 && !slotted[h] {
			taken++
		}
	}
	for h := range after {
		if before[h] {
			continue
		}
		for _, i := range []uint32{h & uint32(flowSlots-1), (h >> 16) & uint32(flowSlots-1)} {
			if slots[i] == 0 || slotted[slots[i]] {
				t.Errorf("new flow %#x went to share_flows while its slot %d was free or an idle flow's (%#x)", h, i, slots[i])
			}
		}
	}
	t.Logf("new flows took %d of the %d slots idle flows held", taken, len(slotted))
	if taken == 0 {
		t.Error("no new flow took an idle flow's slot")
	}
}

// flowSlots is the flow hash in each of mac's egress slots, and the
// hashes of its flows in share_flows.
func (s *Shaper) flowSlots(t *testing.T, mac net.HardwareAddr) ([flowSlots]uint32, map[uint32]bool) {
	t.Helper()
	k, _ := makeKey(Egress, mac)
	var set shaperShareFlowset
	if err := s.objs.ShareFlowsets.Lookup(&k, &set); err != nil {
		t.Fatal(err)
	}
	var slots [flowSlots]uint32
	for i, sl := range set.Slots {
		slots[i] = sl.Hash
	}
	inMap := map[uint32]bool{}
	var fk shaperFlowKey
	var fv shaperFlowVal
	it := s.objs.ShareFlows.Iterate()
	for it.Next(&fk, &fv) {
		if net.HardwareAddr(fk.Mac[:]).String() == mac.String() && fk.Dir == uint8(Egress) {
			inMap[fk.Hash] = true
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return slots, inMap
}

// An older agent's flow-isolated share has a share_children entry only;
// opening the maps gives it its flow set, so its flows keep their own
// children and stamps. A flow set with no children entry is of a share an
// older agent removed after a rollback, and goes.
func TestOlderChildrenCopiedOnOpen(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	older, _ := makeKey(Egress, mac1)
	removed, _ := makeKey(Egress, mac2)
	if err := s.SetShare(Egress, mac1, 0x10010); err != nil {
		t.Fatal(err)
	}
	// 2 Mbit/s, so that four frames make a bulk flow however slowly the
	// runs go (TestFlowSlots).
	if err := s.objs.ShareChildren.Put(&older, &shaperBulkChildren{BytesPerSec: 2e6 / 8, ClassIfindex: 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.objs.ShareQueues.Put(&older, &shaperShareQueue{BytesPerSec: 2e6 / 8}); err != nil {
		t.Fatal(err)
	}
	if err := s.objs.ShareFlowsets.Put(&removed, &shaperShareFlowset{C: shaperBulkChildren{BytesPerSec: 1, ClassIfindex: 9}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openShaper(t, dir)
	defer s.Close()
	var set shaperShareFlowset
	if err := s.objs.ShareFlowsets.Lookup(&older, &set); err != nil {
		t.Fatalf("the older share's flow set after reopening: %v", err)
	}
	if set.C.BytesPerSec != 2e6/8 || set.C.ClassIfindex != 7 {
		t.Errorf("the older share's flow set: %+v, want its children entry's rate and class device", set.C)
	}
	if err := s.objs.ShareFlowsets.Lookup(&removed, &set); err == nil {
		t.Error("a flow set with no children entry is left after reopening")
	}
	f := make([]byte, 1514)
	copy(f, ipFrame(mac2, mac1, "10.9.0.5", "10.9.0.1", false))
	var out skbCtx
	_, err := s.objs.ClassifyEgress.Run(&ebpf.RunOptions{Data: f, Context: skbCtx{}, ContextOut: &out, Repeat: 4})
	nettest.SkipIfLacks(t, err, nettest.BPF("BPF_PROG_RUN"))
	if err != nil {
		t.Fatal(err)
	}
	if out.Priority < 0x10010+FlowBulkFirst || out.Priority >= 0x10010+FlowBulkFirst+FlowBulkChildren {
		t.Errorf("the older share's bulk flow went to %#x, want a bulk child", out.Priority)
	}
}

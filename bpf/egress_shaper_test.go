package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// skbContext is struct __sk_buff as BPF_PROG_RUN takes and returns it for a
// tc program: the fields up to cb[] spelled out (a test may set priority and
// the ifindexes; the others must stay zero), then room for the rest, as
// the kernel refuses a context out smaller than its own.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
	_                                                                           [188]byte
}

const (
	tcxNext     = -1
	tcActShot   = 2
	tcActRedir  = 7 // what bpf_redirect returns; BPF_PROG_RUN sends nothing
	shareClass  = 0x10010
	socketClass = 0x10020 // a socket's own SO_PRIORITY that reads as a class
)

// run runs prog on a frame from src with ctx, in ns (where ctx's
// ifindexes must exist), and returns its verdict and the context after.
func runOn(t *testing.T, ns netns.NsHandle, prog *ebpf.Program, src []byte, ctx skbContext) (int32, skbContext) {
	t.Helper()
	frame := make([]byte, 64)
	copy(frame[0:6], mac2)
	copy(frame[6:12], src)
	frame[12], frame[13] = 0x08, 0x00
	var out skbContext
	var ret uint32
	err := inNS(ns, func() (err error) {
		ret, err = prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, ContextOut: &out})
		return err
	})
	nettest.SkipIfLacks(t, err, nettest.BPF("BPF_PROG_RUN"))
	return int32(ret), out
}

// With an egress shaper recorded for the parent, classify_egress sends a
// limited share's frames to it, counted once; a frame back from the shaper
// and a frame of no share pass, the latter with its own priority; and
// return_shaped sends what comes back towards the parent, except the
// shaper end's own frames.
func TestEgressShaperVerdicts(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	parent := addVeth(t, h, "parent", "wire", netns.None()).Attrs().Index
	shaper := addVeth(t, h, "shaper", "back", netns.None())
	back, err := h.LinkByName("back")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, mac1, shareClass); err != nil {
		t.Fatal(err)
	}
	onParent := skbContext{Ifindex: uint32(parent), Priority: socketClass}
	classify := func(src []byte, ctx skbContext) (int32, skbContext) {
		return runOn(t, ns, s.objs.ClassifyEgress, src, ctx)
	}
	counted := func() uint64 {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[Key{MAC: mac1.String(), Dir: Egress}].Packets
	}

	// No shaper recorded: an older carve's HTB on the parent classifies.
	if ret, out := classify(mac1, onParent); ret != tcxNext || out.Priority != shareClass {
		t.Errorf("share's frame, no shaper: %d, priority %#x; want TCX_NEXT, %#x", ret, out.Priority, shareClass)
	}
	err = inNS(ns, func() error {
		return s.AttachEgressShaper(parent, shaper.Attrs().Index, back.Attrs().Index, shaper.Attrs().HardwareAddr)
	})
	if err != nil {
		t.Fatal(err)
	}
	before := counted()
	if ret, out := classify(mac1, onParent); ret != tcActRedir || out.Priority != shareClass {
		t.Errorf("share's frame: %d, priority %#x; want redirected, %#x", ret, out.Priority, shareClass)
	}
	if ret, out := classify(mac2, onParent); ret != tcxNext || out.Priority != socketClass {
		t.Errorf("frame of no share: %d, priority %#x; want TCX_NEXT with its own %#x", ret, out.Priority, socketClass)
	}
	returned := onParent
	returned.IngressIfindex = uint32(back.Attrs().Index)
	if ret, out := classify(mac1, returned); ret != tcxNext || out.Priority != socketClass {
		t.Errorf("share's frame back from the shaper: %d, priority %#x; want TCX_NEXT, untouched", ret, out.Priority)
	}
	if n := counted() - before; n != 1 {
		t.Errorf("share's frame counted %d times on its way out and back, want once", n)
	}

	ret := func(src []byte, ifindex int) int32 {
		r, _ := runOn(t, ns, s.objs.ReturnShaped, src, skbContext{Ifindex: uint32(ifindex)})
		return r
	}
	if r := ret(mac1, back.Attrs().Index); r != tcActRedir {
		t.Errorf("shaped frame at the return end: %d, want redirected to the parent", r)
	}
	if r := ret(shaper.Attrs().HardwareAddr, back.Attrs().Index); r != tcActShot {
		t.Errorf("the node's own frame from the shaper end: %d, want dropped", r)
	}
	if r := ret(mac1, parent); r != tcActShot {
		t.Errorf("frame on a device that is no shaper's return: %d, want dropped", r)
	}

	if err := inNS(ns, func() error { return s.DetachEgressShaper(parent, back.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	if ret, _ := classify(mac1, onParent); ret != tcxNext {
		t.Errorf("share's frame after the shaper is gone: %d, want TCX_NEXT", ret)
	}
	if r := ret(mac1, back.Attrs().Index); r != tcActShot {
		t.Errorf("frame at a detached return end: %d, want dropped", r)
	}
}

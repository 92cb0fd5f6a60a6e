package bpf

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf/nettest"
)

func monoNow(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano()) // bpf_ktime_get_ns's clock
}

// TestEDTStamps checks edt_egress's arithmetic with BPF_PROG_RUN, which
// needs no fq: ten back-to-back 64-byte frames at 64000 B/s are spaced 1 ms
// apart, and a frame due beyond the 2 s horizon is dropped.
func TestEDTStamps(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	frame := make([]byte, 64)
	copy(frame[6:12], mac1)
	frame[12], frame[13] = 0x08, 0x00
	if err := s.SetRate(mac1, 64000*8); err != nil {
		t.Fatal(err)
	}
	before := monoNow(t)
	for range 10 {
		ret, err := s.objs.EdtEgress.Run(&ebpf.RunOptions{Data: frame})
		nettest.SkipIfLacks(t, err, nettest.BPF("BPF_PROG_RUN"))
		if int32(ret) != -1 {
			t.Fatalf("returned %d, want TCX_NEXT", int32(ret))
		}
	}
	after := monoNow(t)
	var v shaperShareRate
	k, _ := makeKey(Egress, mac1)
	if err := s.objs.ShareRates.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	// The first frame leaves at once and sets t_last to now; nine follow.
	const nine = 9 * uint64(time.Millisecond)
	if v.T_last < before+nine || v.T_last > after+nine {
		t.Fatalf("t_last %d ns after start, want ≈ 9 ms (run took %d ns)", v.T_last-before, after-before)
	}

	if err := s.SetRate(mac1, 16*8); err != nil { // 64 B takes 4 s
		t.Fatal(err)
	}
	var rets []int32
	for range 2 {
		ret, err := s.objs.EdtEgress.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		rets = append(rets, int32(ret))
	}
	if rets[0] != -1 || rets[1] != 2 {
		t.Fatalf("returns %v, want [-1 2]: first passes, second is past the horizon", rets)
	}
	if err := s.SetRate(mac1, 0); err != nil {
		t.Fatal(err)
	}
}

// TestEDTPacingFQ: edt_egress with fq on the parent holds each share to its
// rate. Needs sch_fq, which this project's reference kernel lacks.
func TestEDTPacingFQ(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	rates := []uint64{50e6, 200e6}
	n := newShareNet(t, len(rates))
	fq := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: n.a.Attrs().Index,
		Handle:    netlink.MakeHandle(1, 0),
		Parent:    netlink.HANDLE_ROOT,
	}, Pacing: 1}
	nettest.SkipIfLacks(t, n.hh.QdiscAdd(fq), nettest.Qdisc("fq"))
	s := openShaper(t, dir)
	defer s.Close()
	for i, mac := range n.macs {
		if err := s.SetRate(mac, rates[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := inNS(n.host, func() error { return s.AttachEDT(n.a.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := inNS(n.host, func() error { return s.Detach(n.a.Attrs().Index) }); err != nil {
			t.Error(err)
		}
	}()
	got := measure(t, n.srv, n.clients, "10.77.0.1", 500*time.Millisecond, 2*time.Second)
	for i, r := range rates {
		ratio := got[i] / float64(r)
		t.Logf("share %s: %.1f Mbit/s goodput paced at %d Mbit/s, ratio %.3f", n.macs[i], got[i]/1e6, r/1e6, ratio)
		if ratio < 0.95*0.9 || ratio > 0.95*1.1 {
			t.Errorf("share %d: goodput/rate %.3f, want 0.95 ± 10%%", i, ratio)
		}
	}
}

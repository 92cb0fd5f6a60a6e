package netdev_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare/hook"
)

// On a kernel without fq_codel, a share's class has children: its sparse
// flows' (served first) and its bulk flows', a child per flow. Under two
// bulk transfers of its own, each way, a pod's ping goes through the sparse
// child and each transfer through a bulk child of its own, which the HTB
// classes' own counters show; unprepare removes the children with the
// share's class. (The latency and fairness this buys are measured by
// BenchmarkLatencyUnderLoad, not asserted here.)
func TestSparseFlowsGetTheirOwnClass(t *testing.T) {
	b, node := flowChildrenBench(t)
	s := b.add("flows", "10M", "10M", nil)
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		var flows []nettest.Flow
		for _, port := range []string{"5401", "5402"} {
			f := nettest.Flow{From: s.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":" + port}
			if dir == bpf.Ingress {
				f = nettest.Flow{From: b.tp.Server, To: s.pod, ToAddr: s.ip + ":" + port}
			}
			flows = append(flows, f)
		}
		before := b.classPackets(t, node, dir)
		loaded := make(chan error, 1)
		go func() {
			_, err := nettest.RunFlows(flows, 500*time.Millisecond, 2*time.Second, nil)
			loaded <- err
		}()
		time.Sleep(700 * time.Millisecond)
		rtts, lost, err := nettest.EchoRTT(s.pod, b.tp.Server, b.tp.ServerIP+":5302", 20*time.Millisecond, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-loaded; err != nil {
			t.Fatal(err)
		}
		after := b.classPackets(t, node, dir)
		sparse := after[bpf.FlowSparseChild] - before[bpf.FlowSparseChild]
		var bulk []uint64
		busy := 0
		for i := range uint16(bpf.FlowBulkChildren) {
			n := after[bpf.FlowBulkFirst+i] - before[bpf.FlowBulkFirst+i]
			bulk = append(bulk, n)
			if n >= 300 {
				busy++
			}
		}
		t.Logf("%s: %d probes answered (%d lost); the sparse child sent %d packets, the bulk children %v", dir, len(rtts), lost, sparse, bulk)
		if int(sparse) < len(rtts) || sparse > uint64(len(rtts)+lost)+20 {
			t.Errorf("%s: the sparse child sent %d packets for %d probes", dir, sparse, len(rtts)+lost)
		}
		// Two TCP transfers at once, each in a bulk child of its own:
		// at 10M, about 1,000 frames each. (A transfer idle for 100 ms,
		// waiting out a loss, may come back in another child.)
		if busy < 2 {
			t.Errorf("%s: %d bulk children sent 300 packets or more under two TCP transfers, want a child each: %v", dir, busy, bulk)
		}
	}
	if err := b.p.Unprepare(t.Context(), s.alloc, s.undo); err != nil {
		t.Fatal(err)
	}
	b.p.WaitReaped()
	b.checkParentClean(t)
}

// A fresh share's flow children must not lend it their own buckets: HTB
// lets a class with tokens of its own send without asking its parent, and
// a class starts with its bucket full. With each child's bucket the share's
// burst, a fresh 100M share whose eight flows started at once sent 783-883
// KB beyond its rate in its first 12 ms (the share's own burst is 100 KB).
// Over every stretch of the first 1.5 s, sampled every 2 ms, the share's
// children together send no more beyond the rate than the share's burst,
// the children's own buckets and one super-packet a child (HTB charges a
// packet after letting it out whole): 662 KB. Each way.
func TestFreshShareHoldsItsRateFromItsFirstFrames(t *testing.T) {
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		t.Run(map[bpf.Direction]string{bpf.Egress: "egress", bpf.Ingress: "ingress"}[dir], func(t *testing.T) {
			freshShareBurst(t, dir)
		})
	}
}

func freshShareBurst(t *testing.T, dir bpf.Direction) {
	// A bench of its own: classStats sees one share's children.
	b, node := flowChildrenBench(t)
	const rate = 100e6
	// The share's burst (netdev's htbBuffer: 8 ms of the rate), the
	// children's own buckets (a frame a bulk child, childOwnBurst; the
	// share's burst for the sparse child) and a super-packet of the pod's
	// (gsoMaxSegs: 4 ms of the rate, 33 segments) a child.
	const bound = 100000 + 100000 + bpf.FlowBulkChildren*1514 + (bpf.FlowBulkChildren+1)*33*1514
	{
		s := b.add("fresh", "100M", "100M", nil)
		var flows []nettest.Flow
		for i := range bpf.FlowBulkChildren {
			port := fmt.Sprint(5401 + i)
			f := nettest.Flow{From: s.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":" + port}
			if dir == bpf.Ingress {
				f = nettest.Flow{From: b.tp.Server, To: s.pod, ToAddr: s.ip + ":" + port}
			}
			flows = append(flows, f)
		}
		children := func() uint64 {
			var n uint64
			for off, c := range b.classStats(t, node, dir) {
				if off >= bpf.FlowSparseChild && off < bpf.FlowBulkFirst+bpf.FlowBulkChildren {
					n += c.Bytes
				}
			}
			return n
		}
		base := children()
		done := make(chan error, 1)
		go func() {
			_, err := nettest.RunFlows(flows, 0, 1500*time.Millisecond, nil)
			done <- err
		}()
		type sample struct {
			at    time.Time
			bytes uint64
		}
		var samples []sample
		for start := time.Now(); time.Since(start) < 1500*time.Millisecond; time.Sleep(2 * time.Millisecond) {
			samples = append(samples, sample{time.Now(), children() - base})
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		most, sent := 0.0, samples[len(samples)-1].bytes
		for i := range samples {
			for j := i + 1; j < len(samples); j++ {
				ex := float64(samples[j].bytes-samples[i].bytes) - rate/8*samples[j].at.Sub(samples[i].at).Seconds()
				most = max(most, ex)
			}
		}
		t.Logf("%s: a fresh 100M share, 8 flows at once: at most %.0f bytes beyond its rate over any stretch of %d samples (bound %d); %d bytes in all", dir, most, len(samples), bound, sent)
		if sent < rate/8 {
			t.Errorf("%s: the share's children sent %d bytes in 1.5 s: the flows did not run", dir, sent)
		}
		if most > bound {
			t.Errorf("%s: a fresh share sent %.0f bytes beyond its rate, over the %d its burst, its children's own buckets and a super-packet each allow", dir, most, bound)
		}
	}
}

// flowChildrenBench is a bench for a share's flow children, with a handle
// in the node's namespace; it skips where the kernel has fq_codel, which
// is the share's leaf there, and the share's class has no children.
func flowChildrenBench(t *testing.T) (*bench, *netlink.Handle) {
	t.Helper()
	b := newBench(t)
	if b.hasFQCodel(t) {
		t.Skip("this kernel has fq_codel: it is the share's leaf, and the share's class has no children")
	}
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	return b, node
}

// classPackets is what the share's flow children have sent, by offset from
// the share's class (bpf.FlowSparseChild, bpf.FlowBulkFirst), on the
// direction's device: the egress shaper, or the IFB.
func (b *bench) classPackets(t *testing.T, node *netlink.Handle, dir bpf.Direction) map[uint16]uint64 {
	t.Helper()
	out := map[uint16]uint64{}
	for off, c := range b.classStats(t, node, dir) {
		out[off] = c.Packets
	}
	return out
}

// classStats is classPackets with bytes.
func (b *bench) classStats(t testing.TB, node *netlink.Handle, dir bpf.Direction) map[uint16]bpf.Counters {
	t.Helper()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("cveg%d", parent.Attrs().Index)
	if dir == bpf.Ingress {
		name = fmt.Sprintf("cvifb%d", parent.Attrs().Index)
	}
	dev, err := node.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	classes, err := node.ClassList(dev, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16]bpf.Counters{}
	for _, c := range classes {
		pmajor, pminor := netlink.MajorMinor(c.Attrs().Parent)
		if pmajor != 1 || pminor == 0 {
			continue
		}
		_, minor := netlink.MajorMinor(c.Attrs().Handle)
		if st := c.Attrs().Statistics; st != nil && st.Basic != nil {
			out[minor-pminor] = bpf.Counters{Bytes: st.Basic.Bytes, Packets: uint64(st.Basic.Packets)}
		}
	}
	return out
}

// TestShareInterfaceQueueSettings checks what the hook gives a limited
// share's interface in its pod: GSO super-packets of about 4 ms of the
// share's egress rate, never under two segments (the kernel's 64 KiB where
// that is less, or egress is unlimited), and, where its ingress class
// has bulk children, the AQM's program on its ingress, once, however many
// of the pod's containers ran the hook (b.add runs it twice).
func TestShareInterfaceQueueSettings(t *testing.T) {
	b := newBench(t)
	for _, c := range []struct {
		egress, ingress string
		segs            uint32
		aqm             bool
	}{{"10M", "10M", 3, true}, {"100M", "", 33, false}, {"200M", "", 0, false}, {"", "20M", 0, true}} {
		s := b.add("q"+c.egress+c.ingress, c.egress, c.ingress, nil)
		var flowClasses bool
		if err := json.Unmarshal(s.undo, &struct{ FlowClasses *bool }{&flowClasses}); err != nil {
			t.Fatal(err)
		}
		if !flowClasses && !b.hasFQCodel(t) {
			t.Fatalf("share %s/%s has no flow classes on a kernel without fq_codel", c.egress, c.ingress)
		}
		err := hook.InNetns(s.pod, func() error {
			iface, err := netlink.LinkByName(s.spec.PodName)
			if err != nil {
				return err
			}
			if got := iface.Attrs().GSOMaxSegs; c.segs == 0 && got < 64 {
				t.Errorf("egress %q: GSO limit %d segments, want the kernel's", c.egress, got)
			} else if c.segs != 0 && got != c.segs {
				t.Errorf("egress %q: GSO limit %d segments, want %d", c.egress, got, c.segs)
			}
			res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil && nettest.LacksTCX(t) {
				// Before 6.6 there is no TCX to query, and with
				// fq_codel (6.1) no share_dequeued to attach.
				if c.aqm && flowClasses {
					t.Errorf("egress %q ingress %q: flow classes with AQM on a kernel without TCX", c.egress, c.ingress)
				}
				return nil
			}
			if err != nil {
				return err
			}
			n := 0
			for _, p := range res.Programs {
				prog, err := ebpf.NewProgramFromID(p.ID)
				if err != nil {
					continue
				}
				if info, err := prog.Info(); err == nil && info.Name == "share_dequeued" {
					n++
				}
				prog.Close()
			}
			// A class that lets no pod have CAP_NET_ADMIN gets a
			// cls_bpf filter instead (bpf.PodHookFilter).
			filters, err := netlink.FilterList(iface, netlink.HANDLE_MIN_INGRESS)
			if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: no clsact
				return err
			}
			for _, f := range filters {
				if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == bpf.LegacyFilterName("share_dequeued") {
					n++
				}
			}
			if want := map[bool]int{true: 1}[c.aqm && flowClasses]; n != want {
				t.Errorf("egress %q ingress %q: share_dequeued attached %d times on the pod's interface, want %d", c.egress, c.ingress, n, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// hasFQCodel says whether the kernel has sch_fq_codel, which carve makes
// the share's leaf instead of flow children.
func (b *bench) hasFQCodel(t *testing.T) bool {
	t.Helper()
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	probe := netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0x99, 0)})
	if err := node.QdiscAdd(probe); err != nil {
		return false
	}
	_ = node.QdiscDel(probe)
	return true
}

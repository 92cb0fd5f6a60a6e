package netdev_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
)

// On a kernel without fq_codel, a share's class has two children: its
// sparse flows' (served first) and its bulk flows'. Under its own bulk
// transfer, each way, a pod's ping goes through the sparse child and the
// transfer through the bulk one, which the HTB classes' own counters show;
// unprepare removes the children with the share's class. (The latency this
// buys is measured by BenchmarkLatencyUnderLoad, not asserted here.)
func TestSparseFlowsGetTheirOwnClass(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	probe := netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0x99, 0)})
	if err := node.QdiscAdd(probe); err == nil {
		_ = node.QdiscDel(probe)
		t.Skip("this kernel has fq_codel: it is the share's leaf, and the share's class has no children")
	}
	s := b.add("flows", "10M", "10M", nil)
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		f := nettest.Flow{From: s.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":5401"}
		if dir == bpf.Ingress {
			f = nettest.Flow{From: b.tp.Server, To: s.pod, ToAddr: s.ip + ":5401"}
		}
		before := b.classPackets(t, node, dir)
		loaded := make(chan error, 1)
		go func() {
			_, err := nettest.RunFlows([]nettest.Flow{f}, 500*time.Millisecond, 2*time.Second, nil)
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
		sparse, bulk := after[bpf.FlowSparseChild]-before[bpf.FlowSparseChild], after[bpf.FlowBulkFirst]-before[bpf.FlowBulkFirst]
		t.Logf("%s: %d probes answered (%d lost); the sparse child sent %d packets, the bulk child %d", dir, len(rtts), lost, sparse, bulk)
		if int(sparse) < len(rtts) || sparse > uint64(len(rtts)+lost)+20 {
			t.Errorf("%s: the sparse child sent %d packets for %d probes", dir, sparse, len(rtts)+lost)
		}
		if bulk < 500 {
			t.Errorf("%s: the bulk child sent %d packets under a TCP transfer", dir, bulk)
		}
	}
	if err := b.p.Unprepare(t.Context(), s.alloc, s.undo); err != nil {
		t.Fatal(err)
	}
	b.p.WaitReaped()
	b.checkParentClean(t)
}

// classPackets is what the share's flow children have sent, by offset from
// the share's class (bpf.FlowSparseChild, bpf.FlowBulkFirst), on the
// direction's device: the egress shaper, or the IFB.
func (b *bench) classPackets(t *testing.T, node *netlink.Handle, dir bpf.Direction) map[uint16]uint64 {
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
	out := map[uint16]uint64{}
	for _, c := range classes {
		pmajor, pminor := netlink.MajorMinor(c.Attrs().Parent)
		if pmajor != 1 || pminor == 0 {
			continue
		}
		_, minor := netlink.MajorMinor(c.Attrs().Handle)
		if st := c.Attrs().Statistics; st != nil && st.Basic != nil {
			out[minor-pminor] = uint64(st.Basic.Packets)
		}
	}
	return out
}

package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
)

// An unprepared share's classes wait, parked, for the next share on the
// device, which takes them over by class changes: no class is added or
// deleted (each add or delete walks every class of the HTB), and the drops
// counted for the first share are not the next one's. An agent that
// restarts takes over what the one before it parked. Once no share is
// left, the shaper and the IFB go, parked classes with them.
func TestUnpreparedClassesAreTakenOverByTheNext(t *testing.T) {
	b := newBench(t)
	node, parent := b.nodeParent(t)
	keeper := b.add("keeper", "10M", "10M", nil) // holds the shaper and the IFB
	before := b.p
	// The shares' cleanups unprepare through b.p, and the first
	// preparer's wait for its reaper is the last cleanup.
	defer func() { b.p = before }()
	first := b.add("first", "10M", "20M", nil)
	// A UDP flood past the egress limit: drops on first's classes.
	if _, err := nettest.RunUDP([]nettest.Flow{{From: first.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":5401"}}, 1400, 0, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	rec := record(t, first.undo)
	devices := map[string]uint16{netdev.EgressShaperName(parent.Attrs().Index): rec.EgressMinor, netdev.IFBName(parent.Attrs().Index): rec.IngressMinor}
	classes := func(dev string) map[uint32]*netlink.HtbClass {
		t.Helper()
		l, err := node.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		list, err := node.ClassList(l, netlink.MakeHandle(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]*netlink.HtbClass{}
		for _, c := range list {
			if htb, ok := c.(*netlink.HtbClass); ok {
				out[c.Attrs().Handle] = htb
			}
		}
		return out
	}
	count := map[string]int{}
	for dev := range devices {
		count[dev] = len(classes(dev))
	}

	// Parked by the unprepare itself, not by the reaper later: the next
	// pod may start at once. Without its record (a crash before its
	// prepare returned), which is all the harder: the unprepare does not
	// know the share had flow children, whose drops go to the base too.
	if err := b.p.Unprepare(context.Background(), first.alloc, nil); err != nil {
		t.Fatal(err)
	}
	for dev, minor := range devices {
		got := classes(dev)
		if len(got) != count[dev] {
			t.Errorf("%s: %d classes after first was unprepared, want the %d it had (parked)", dev, len(got), count[dev])
		}
		if c := got[netlink.MakeHandle(1, minor)]; c == nil || c.Cbuffer <= c.Buffer {
			t.Errorf("%s: first's class 1:%x after it was unprepared is %+v, want it parked (its ceil burst past its burst)", dev, minor, c)
		}
	}

	second := b.add("second", "50M", "30M", nil)
	rec2 := record(t, second.undo)
	if rec2.EgressMinor != rec.EgressMinor || rec2.IngressMinor != rec.IngressMinor {
		t.Errorf("second took classes 1:%x / 1:%x, want first's parked 1:%x / 1:%x", rec2.EgressMinor, rec2.IngressMinor, rec.EgressMinor, rec.IngressMinor)
	}
	if rec2.EgressDropBase == 0 {
		t.Error("second's record has no egress drop base, but first's flood dropped frames on those classes")
	}
	rates := map[string]uint64{netdev.EgressShaperName(parent.Attrs().Index): 50e6, netdev.IFBName(parent.Attrs().Index): 30e6}
	for dev, minor := range devices {
		got := classes(dev)
		if len(got) != count[dev] {
			t.Errorf("%s: %d classes after second was prepared, want %d: none added", dev, len(got), count[dev])
		}
		c := got[netlink.MakeHandle(1, minor)]
		if c == nil || c.Cbuffer != c.Buffer || c.Rate*8 != rates[dev] {
			t.Errorf("%s: second's class 1:%x is %+v, want it unmarked, at %d bit/s", dev, minor, c, rates[dev])
			continue
		}
		for h, child := range got {
			if child.Attrs().Parent == h || child.Attrs().Parent != netlink.MakeHandle(1, minor) {
				continue
			}
			if child.Ceil*8 != rates[dev] {
				t.Errorf("%s: flow child %x of second's class borrows up to %d bit/s, want %d", dev, h, child.Ceil*8, rates[dev])
			}
		}
	}
	// The kubelet retries first's unprepare (its checkpoint write
	// failed, say): second's classes are not first's to park again.
	if err := b.p.Unprepare(context.Background(), first.alloc, first.undo); err != nil {
		t.Fatal(err)
	}
	b.p.WaitReaped()
	for dev, minor := range devices {
		if c := classes(dev)[netlink.MakeHandle(1, minor)]; c == nil || c.Cbuffer != c.Buffer {
			t.Errorf("%s: second's class 1:%x after first's unprepare was retried is %+v, want it second's still, unmarked", dev, minor, c)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.p)
	if drops := shareDrops(t, reg, "default/second"); drops["egress"] != 0 || len(drops) != 2 {
		t.Errorf("second's drops by the metrics: %v, want 0 each way: first's are not second's", drops)
	}

	// A restarted agent: the keeper's record restored, second's classes
	// parked by the agent before it.
	if err := b.p.Unprepare(context.Background(), second.alloc, second.undo); err != nil {
		t.Fatal(err)
	}
	b.p.WaitReaped()
	b.p = b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP)
	b.p.Restore([]prepare.Allocation{keeper.alloc}, []json.RawMessage{keeper.undo})
	third := b.add("third", "10M", "10M", nil)
	if rec3 := record(t, third.undo); rec3.EgressMinor != rec.EgressMinor || rec3.IngressMinor != rec.IngressMinor {
		t.Errorf("after a restart third took classes 1:%x / 1:%x, want the parked 1:%x / 1:%x", rec3.EgressMinor, rec3.IngressMinor, rec.EgressMinor, rec.IngressMinor)
	}

	for _, s := range []*share{keeper, third} {
		if err := b.p.Unprepare(context.Background(), s.alloc, s.undo); err != nil {
			t.Fatal(err)
		}
	}
	b.p.WaitReaped()
	for dev := range devices {
		if _, err := node.LinkByName(dev); err == nil {
			t.Errorf("%s is still there after every share went", dev)
		}
	}
}

// record decodes a share's undo record.
func record(t *testing.T, undo json.RawMessage) netdev.ShareRecord {
	t.Helper()
	u, err := netdev.DecodeShareRecord(undo)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// shareDrops is what a scrape reports as a claim's drops, by direction.
func shareDrops(t *testing.T, reg *prometheus.Registry, claim string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "carve_share_drops_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["claim"] == claim {
				out[labels["direction"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// A parked block goes to one share only: an agent that parked it, whose
// record is stale because another agent (a rolling update's) took it since,
// asks the kernel before taking it and picks a block of its own instead.
func TestAParkedBlockIsTakenOnce(t *testing.T) {
	b := newBench(t)
	agentA := b.p
	b.add("keeper", "10M", "10M", nil)
	first := b.add("first", "10M", "10M", nil)
	if err := agentA.Unprepare(context.Background(), first.alloc, first.undo); err != nil {
		t.Fatal(err)
	}
	agentA.WaitReaped()
	parked := record(t, first.undo).EgressMinor

	b.p = b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP) // agent B
	second := b.add("second", "10M", "10M", nil)
	if got := record(t, second.undo).EgressMinor; got != parked {
		t.Fatalf("agent B gave second class 1:%x, want the parked 1:%x", got, parked)
	}
	b.p = agentA
	third := b.add("third", "10M", "10M", nil)
	if got := record(t, third.undo); got.EgressMinor == parked || got.IngressMinor == parked {
		t.Errorf("agent A gave third classes 1:%x / 1:%x, which agent B had given second", got.EgressMinor, got.IngressMinor)
	}
}

// At most 128 blocks wait on a device: past that an unprepared share's
// classes are deleted. A parked block the kernel no longer has (the device
// made again) is not taken: the agent forgets what it knew of the device's
// parked blocks and gives the share a block of its own.
func TestParkedBlocksAreBounded(t *testing.T) {
	b := newBench(t)
	node, parent := b.nodeParent(t)
	shaper := netdev.EgressShaperName(parent.Attrs().Index)
	b.add("keeper", "10M", "", nil)
	link, err := node.LinkByName(shaper)
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		list, err := node.ClassList(link, netlink.MakeHandle(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	keepers := count()
	first := b.add("first", "10M", "", nil)
	netdev.FillParked(b.p, shaper, 128)
	if err := b.p.Unprepare(context.Background(), first.alloc, first.undo); err != nil {
		t.Fatal(err)
	}
	b.p.WaitReaped()
	if after := count(); after != keepers {
		t.Errorf("%s: %d classes after first went with 128 blocks parked, want the keeper's %d: first's deleted", shaper, after, keepers)
	}
	// The share gets a block the kernel has, as its own: a class of its
	// rate with its children (a block it makes from its preferred minor
	// may be where a phantom was: those are forgotten, and free).
	second := b.add("second", "10M", "", nil)
	got := record(t, second.undo).EgressMinor
	classes, err := node.ClassList(link, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	var class *netlink.HtbClass
	children := 0
	for _, c := range classes {
		if c.Attrs().Handle == netlink.MakeHandle(1, got) {
			class, _ = c.(*netlink.HtbClass)
		}
		if c.Attrs().Parent == netlink.MakeHandle(1, got) {
			children++
		}
	}
	if class == nil || class.Ceil != 10e6/8 {
		t.Errorf("second took class 1:%x, which the kernel has as %+v, want a class of 10M: one of the parked blocks the kernel does not have?", got, class)
	}
	if record(t, second.undo).FlowClasses && children != netdev.FlowChildren {
		t.Errorf("second's class 1:%x has %d children, want %d", got, children, netdev.FlowChildren)
	}
}

// A block an agent before issue 37 parked has tbf leaves that split
// super-packets under its bulk children, and a sparse child assured
// nothing of its own: the share that takes it over gets the current
// queues, bfifo leaves and the sparse child's own part of the rate.
func TestAnOlderParkedBlockGetsTodaysQueues(t *testing.T) {
	b := newBench(t)
	node, parent := b.nodeParent(t)
	keeper := b.add("keeper", "10M", "", nil) // holds the shaper
	old := b.add("old", "10M", "", nil)
	rec := record(t, old.undo)
	if !rec.FlowClasses {
		t.Skip("the kernel has fq_codel: shares get no flow children")
	}
	shaper, err := node.LinkByName(netdev.EgressShaperName(parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	// What the older agent left: a splitting tbf under each bulk child,
	// the sparse child at 8 kbit/s.
	for i := bpf.FlowBulkFirst; i < bpf.FlowBulkFirst+bpf.FlowBulkChildren; i++ {
		child := rec.EgressMinor + uint16(i)
		tbf := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: shaper.Attrs().Index, Parent: netlink.MakeHandle(1, child), Handle: netlink.MakeHandle(child, 0)},
			Rate: 10e6, Limit: 67050, Buffer: 3036}
		if err := node.QdiscReplace(tbf); err != nil {
			// Replace keeps the kind: delete the bfifo first.
			_ = node.QdiscDel(&netlink.GenericQdisc{QdiscAttrs: tbf.QdiscAttrs, QdiscType: "bfifo"})
			if err := node.QdiscAdd(tbf); err != nil {
				t.Fatalf("the older agent's tbf under 1:%x: %v", child, err)
			}
		}
	}
	sparse := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: shaper.Attrs().Index, Parent: netlink.MakeHandle(1, rec.EgressMinor), Handle: netlink.MakeHandle(1, rec.EgressMinor+bpf.FlowSparseChild)},
		netlink.HtbClassAttrs{Rate: 8000, Ceil: 10e6, Quantum: 1514})
	if err := node.ClassChange(sparse); err != nil {
		t.Fatal(err)
	}
	if err := b.p.Unprepare(context.Background(), old.alloc, old.undo); err != nil {
		t.Fatal(err)
	}
	// Today's agent, started after the older one parked the block.
	before := b.p
	defer func() { b.p = before }()
	b.p = b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP)
	b.p.Restore([]prepare.Allocation{keeper.alloc}, []json.RawMessage{keeper.undo})
	next := b.add("next", "10M", "", nil)
	if got := record(t, next.undo).EgressMinor; got != rec.EgressMinor {
		t.Fatalf("the next share took block 1:%x, not the parked 1:%x", got, rec.EgressMinor)
	}
	qdiscs, err := node.QdiscList(shaper)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[uint32]string{}
	for _, q := range qdiscs {
		kinds[q.Attrs().Parent] = q.Type()
	}
	for i := bpf.FlowSparseChild; i < bpf.FlowBulkFirst+bpf.FlowBulkChildren; i++ {
		if k := kinds[netlink.MakeHandle(1, rec.EgressMinor+uint16(i))]; k != "bfifo" {
			t.Errorf("leaf of flow class 1:%x is %q, want bfifo", rec.EgressMinor+uint16(i), k)
		}
	}
	classes, err := node.ClassList(shaper, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		const want = uint64(10e6 / 8 / bpf.FlowSparseDiv)
		if htb, ok := c.(*netlink.HtbClass); ok && c.Attrs().Handle == sparse.Handle && htb.Rate != want {
			t.Errorf("sparse child 1:%x: rate %d bytes/s, want %d", rec.EgressMinor+bpf.FlowSparseChild, htb.Rate, want)
		}
	}
}

// A parked block taken by a share of the rates its last share had keeps
// its flow children as they are (no request for them under the parent's
// lock): they are then exactly what a fresh block of those rates gets,
// classes and leaves. One of other rates gets them set again.
func TestAParkedBlockOfTheSameRatesKeepsItsQueues(t *testing.T) {
	b := newBench(t)
	node, parent := b.nodeParent(t)
	b.add("keeper", "10M", "10M", nil)
	// queues is what the kernel has under class 1:minor of the egress
	// shaper: each child's class and its leaf, by the child's offset.
	queues := func(minor uint16) map[uint16]string {
		t.Helper()
		l, err := node.LinkByName(netdev.EgressShaperName(parent.Attrs().Index))
		if err != nil {
			t.Fatal(err)
		}
		classes, err := node.ClassList(l, netlink.MakeHandle(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		qdiscs, err := node.QdiscList(l)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint16]string{}
		for _, c := range classes {
			htb, ok := c.(*netlink.HtbClass)
			if !ok || c.Attrs().Parent != netlink.MakeHandle(1, minor) {
				continue
			}
			_, m := netlink.MajorMinor(c.Attrs().Handle)
			out[m-minor] = fmt.Sprintf("rate %d ceil %d buffer %d cbuffer %d quantum %d prio %d", htb.Rate, htb.Ceil, htb.Buffer, htb.Cbuffer, htb.Quantum, htb.Prio)
			for _, q := range qdiscs {
				if q.Attrs().Parent == c.Attrs().Handle {
					out[m-minor] += fmt.Sprintf("; leaf %s %+v", q.Type(), q)
				}
			}
		}
		if len(out) == 0 {
			t.Fatalf("no flow children under 1:%x", minor)
		}
		return out
	}
	fresh := b.add("fresh", "20M", "20M", nil)
	if !record(t, fresh.undo).FlowClasses {
		t.Skip("the kernel has fq_codel: shares get no flow children")
	}
	want := queues(record(t, fresh.undo).EgressMinor)
	first := b.add("first", "20M", "20M", nil)
	rec := record(t, first.undo)
	if err := b.p.Unprepare(context.Background(), first.alloc, first.undo); err != nil {
		t.Fatal(err)
	}
	watch := watchChildren(t, b.tp.Node, rec.EgressMinor)
	second := b.add("second", "20M", "20M", nil)
	if n := watch(); n != 0 {
		t.Errorf("taking the block parked at the same rates changed %d of its flow children, want none", n)
	}
	if rec2 := record(t, second.undo); rec2.EgressMinor != rec.EgressMinor {
		t.Fatalf("second took 1:%x, want first's parked 1:%x", rec2.EgressMinor, rec.EgressMinor)
	}
	got := queues(rec.EgressMinor)
	for off, w := range want {
		// The leaves' handles follow their classes: compare the rest.
		if g := stripHandles(got[off]); g != stripHandles(w) {
			t.Errorf("child +%d of the taken block: %s\nwant as a fresh block's: %s", off, got[off], w)
		}
	}
	// A second agent (a rolling update's) takes the block parked by
	// the first and leaves other children on it (an older carve's);
	// the first agent, taking it back at the same rates, sets them.
	if err := b.p.Unprepare(context.Background(), second.alloc, second.undo); err != nil {
		t.Fatal(err)
	}
	agentA := b.p
	defer func() { b.p = agentA }()
	b.p = b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP)
	other := b.add("other", "20M", "20M", nil)
	if m := record(t, other.undo).EgressMinor; m != rec.EgressMinor {
		t.Fatalf("the second agent took 1:%x, want the parked 1:%x", m, rec.EgressMinor)
	}
	shaper, err := node.LinkByName(netdev.EgressShaperName(parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	sparse := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: shaper.Attrs().Index, Parent: netlink.MakeHandle(1, rec.EgressMinor), Handle: netlink.MakeHandle(1, rec.EgressMinor+bpf.FlowSparseChild)},
		netlink.HtbClassAttrs{Rate: 8000, Ceil: 20e6, Quantum: 1514})
	if err := node.ClassChange(sparse); err != nil {
		t.Fatal(err)
	}
	if err := b.p.Unprepare(context.Background(), other.alloc, other.undo); err != nil {
		t.Fatal(err)
	}
	b.p = agentA
	watch = watchChildren(t, b.tp.Node, rec.EgressMinor)
	again := b.add("again", "20M", "20M", nil)
	if n := watch(); n == 0 {
		t.Error("taking back the block another agent parked changed none of its flow children")
	}
	if m := record(t, again.undo).EgressMinor; m != rec.EgressMinor {
		t.Fatalf("the first agent took 1:%x back, want the parked 1:%x", m, rec.EgressMinor)
	}
	got = queues(rec.EgressMinor)
	for off, w := range want {
		if g := stripHandles(got[off]); g != stripHandles(w) {
			t.Errorf("child +%d of the block taken back from the second agent: %s\nwant as a fresh block's: %s", off, got[off], w)
		}
	}
	if err := b.p.Unprepare(context.Background(), again.alloc, again.undo); err != nil {
		t.Fatal(err)
	}
	third := b.add("third", "40M", "40M", nil)
	if rec3 := record(t, third.undo); rec3.EgressMinor != rec.EgressMinor {
		t.Fatalf("third took 1:%x, want the parked 1:%x", rec3.EgressMinor, rec.EgressMinor)
	}
	for off, c := range queues(rec.EgressMinor) {
		if !strings.Contains(c, fmt.Sprintf("ceil %d ", 40_000_000/8)) {
			t.Errorf("child +%d of the block taken at 40M: %s, want its ceil at 40M", off, c)
		}
	}
}

// stripHandles drops the handle and parent fields from a qdisc's %+v.
func stripHandles(s string) string {
	return regexp.MustCompile(`(Handle|Parent): [0-9a-f:]+`).ReplaceAllString(s, "")
}

// watchChildren listens to the kernel's traffic-control notifications in
// ns and returns a func that says how many class changes it saw since, of
// the flow children of a block from base (any device).
func watchChildren(t *testing.T, ns netns.NsHandle, base uint16) func() int {
	t.Helper()
	sock, err := nl.SubscribeAt(ns, netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_TC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sock.Close)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := sock.SetReceiveTimeout(&tv); err != nil {
		t.Fatal(err)
	}
	return func() int {
		n := 0
		for {
			msgs, _, err := sock.Receive()
			if err != nil {
				return n // the timeout: nothing more
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWTCLASS {
					continue
				}
				_, minor := netlink.MajorMinor(nl.DeserializeTcMsg(m.Data).Handle)
				if minor > base && minor < base+16 {
					n++
				}
			}
		}
	}
}

// nodeParent is a netlink handle of the bench's node namespace, closed when
// t ends, and the parent NIC in it.
func (b *bench) nodeParent(t *testing.T) (*netlink.Handle, netlink.Link) {
	t.Helper()
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	return node, parent
}

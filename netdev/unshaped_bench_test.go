package netdev_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// unshapedStreams is how many TCP streams each case runs at once: enough
// that a lock every frame takes (a root qdisc's) is contended.
const unshapedStreams = 4

// The plain and carve's node take turns of unshapedSlot, unshapedRounds
// times (see nettest.RunAlternating): other work on the machine moves
// one-off measurements by ±20%, and weighs on turns this short alike.
const (
	unshapedSlot   = 100 * time.Millisecond
	unshapedRounds = 60
)

// BenchmarkUnlimitedShare is the cost of carve's shaping to the traffic it
// does not limit: a pod that is no share of carve's (a macvlan of its own on
// the parent), the node's own traffic, and a share with no limit. Each case
// runs on two nodes side by side: one with no limited share on its parent
// (no carve qdisc or program there), one with a limited share, idle. Their
// flows stay open and take turns to send; the ratio is what carve's node
// delivered in its turns to what the plain node did in its turns, so both
// sides of it are from the same run and the same moments.
func BenchmarkUnlimitedShare(b *testing.B) {
	for _, c := range []string{"unshaped-pod", "host", "unlimited-share"} {
		b.Run(c, func(b *testing.B) {
			plain, carve := newBench(b), newBench(b)
			carve.add("limited", "200M", "200M", nil)
			sets := [][]nettest.Flow{plain.streams(plain.unshapedSender(c)), carve.streams(carve.unshapedSender(c))}
			var sum [2]nettest.Slot
			for b.Loop() {
				slots, err := nettest.RunAlternating(sets, time.Second, unshapedSlot, unshapedRounds)
				if err != nil {
					b.Fatal(err)
				}
				for i := range sets {
					for r, s := range slots[i] {
						sum[i].Bytes += s.Bytes
						sum[i].Duration += s.Duration
						if i == 1 {
							b.Logf("round %d: plain %.2f Gbit/s, carve %.2f Gbit/s", r, slots[0][r].Rate()/1e9, s.Rate()/1e9)
						}
					}
				}
			}
			b.ReportMetric(sum[0].Rate()/1e9, "plain-Gbps")
			b.ReportMetric(sum[1].Rate()/1e9, "carve-Gbps")
			b.ReportMetric(sum[1].Rate()/sum[0].Rate(), "vs-plain-ratio")
		})
	}
}

// unshapedSender is the namespace whose traffic case c measures: a pod
// with a macvlan carve did not make, the node itself (an address on the
// parent), or the pod of an unlimited share.
func (b *bench) unshapedSender(c string) netns.NsHandle {
	b.t.Helper()
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		b.t.Fatal(err)
	}
	defer node.Close()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		b.t.Fatal(err)
	}
	switch c {
	case "host":
		addr, _ := netlink.ParseAddr("10.77.0.250/24")
		if err := node.AddrAdd(parent, addr); err != nil {
			b.t.Fatal(err)
		}
		return b.tp.Node
	case "unlimited-share":
		return b.add("free", "", "", nil).pod
	}
	pod := b.tp.NewPod("plainpod")
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "plainmv", parent.Attrs().Index
	mv := &netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_VEPA}
	if err := node.LinkAdd(mv); err != nil {
		b.t.Fatal(err)
	}
	if err := node.LinkSetNsFd(mv, int(pod)); err != nil {
		b.t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(pod)
	if err != nil {
		b.t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("plainmv")
	if err != nil {
		b.t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.77.0.251/24")
	if err := h.AddrAdd(link, addr); err != nil {
		b.t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		b.t.Fatal(err)
	}
	return pod
}

// streams are unshapedStreams TCP flows from sender to the server.
func (b *bench) streams(sender netns.NsHandle) []nettest.Flow {
	var flows []nettest.Flow
	for i := range unshapedStreams {
		flows = append(flows, nettest.Flow{From: sender, To: b.tp.Server, ToAddr: net.JoinHostPort(b.tp.ServerIP, fmt.Sprint(5201+i))})
	}
	return flows
}

package netdev_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/netdev/netdevtest"
)

// unshapedStreams is how many TCP streams each case runs at once: enough
// that a lock every frame takes (a root qdisc's) is contended.
const unshapedStreams = 4

// unshapedPairs is how many back-to-back measurements of the plain and of
// carve's node each iteration takes. Other work on the machine moves a
// single measurement by ±20%; the median of the pairs' ratios does not
// move as much.
const unshapedPairs = 7

// BenchmarkUnlimitedShare is the cost of carve's shaping to the traffic it
// does not limit: a pod that is no share of carve's (a macvlan of its own on
// the parent), the node's own traffic, and a share with no limit. Each case
// runs on two nodes side by side: one with no limited share on its parent
// (no carve qdisc or program there), one with a limited share, idle. Each
// pair of measurements takes one of each, in alternating order; the ratio
// is the median over the pairs of carve's rate to the plain node's, so
// both sides of it are from the same run and the same moment.
func BenchmarkUnlimitedShare(b *testing.B) {
	for _, c := range []string{"unshaped-pod", "host", "unlimited-share"} {
		b.Run(c, func(b *testing.B) {
			plain, carve := newBench(b), newBench(b)
			carve.add("limited", "200M", "200M", nil)
			plainFrom, carveFrom := plain.unshapedSender(c), carve.unshapedSender(c)
			var plainSum, carveSum float64
			var ratios []float64
			for b.Loop() {
				for i := range unshapedPairs {
					var pr, cr float64
					if i%2 == 0 {
						pr = plain.streams(plainFrom, unshapedStreams, time.Second)
						cr = carve.streams(carveFrom, unshapedStreams, time.Second)
					} else {
						cr = carve.streams(carveFrom, unshapedStreams, time.Second)
						pr = plain.streams(plainFrom, unshapedStreams, time.Second)
					}
					plainSum, carveSum = plainSum+pr, carveSum+cr
					ratios = append(ratios, cr/pr)
				}
			}
			slices.Sort(ratios)
			n := float64(len(ratios))
			b.ReportMetric(plainSum/n/1e9, "plain-Gbps")
			b.ReportMetric(carveSum/n/1e9, "carve-Gbps")
			b.ReportMetric(ratios[len(ratios)/2], "vs-plain-ratio")
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

// streams runs n TCP streams from sender to the server at once for d and
// returns their summed goodput in bits/s.
func (b *bench) streams(sender netns.NsHandle, n int, d time.Duration) float64 {
	b.t.Helper()
	var flows []netdevtest.Flow
	for i := range n {
		flows = append(flows, netdevtest.Flow{From: sender, To: b.tp.Server, ToAddr: net.JoinHostPort(b.tp.ServerIP, fmt.Sprint(5201+i))})
	}
	res, err := netdevtest.RunFlows(flows, 300*time.Millisecond, d, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	var sum float64
	for _, r := range res {
		sum += r.Goodput()
	}
	return sum
}

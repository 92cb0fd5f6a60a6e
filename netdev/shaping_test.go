package netdev_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev/netdevtest"
)

// Two shares of one parent at once, each held to its own rate in both
// directions: goodput within ±10% of 0.956 of the allocation at 50M, 200M
// and 1G.
func TestSharesHoldTheirRates(t *testing.T) {
	b := newBench(t)
	for r, round := range [][2]string{{"50M", "200M"}, {"1G", "200M"}} {
		shares := []*share{b.add(fmt.Sprintf("a%d", r), round[0], round[0], nil), b.add(fmt.Sprintf("b%d", r), round[1], round[1], nil)}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			goodput, l2 := b.measure(dir, shares, 3*time.Second)
			for i, limit := range round {
				l2Ratio, gpRatio := l2[i]/rate(limit), goodput[i]/rate(limit)
				t.Logf("%s %s share of %s: L2 %.1f Mbit/s (ratio %.3f), goodput %.1f Mbit/s (ratio %.3f)",
					dir, []string{"first", "second"}[i], limit, l2[i]/1e6, l2Ratio, goodput[i]/1e6, gpRatio)
				// The classifier counts frames before the share's
				// queue, so L2 includes what its bounded leaf dropped
				// and TCP resent; goodput is what the share delivered
				// (0.956 of the rate is the limit met to within 1%).
				if gpRatio < 0.956*0.9 || gpRatio > 0.956*1.1 || l2Ratio < 0.9 {
					t.Errorf("%s share of %s: goodput ratio %.3f is outside 0.956 ± 10%%, or L2 ratio %.3f under 0.9", dir, limit, gpRatio, l2Ratio)
				}
			}
		}
		for _, s := range shares {
			if err := b.p.Unprepare(context.Background(), s.alloc, nil); err != nil {
				t.Fatalf("unprepare: %v", err)
			}
		}
	}
}

// Where the kernel has sch_fq, egress is paced by EDT on an fq root instead
// of HTB, and holds the share to its rate.
func TestEDTShare(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	peer := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fqprobe"}, PeerName: "fqprobe1"}
	if err := node.LinkAdd(peer); err != nil {
		t.Fatal(err)
	}
	probe, _ := node.LinkByName("fqprobe")
	err := node.QdiscReplace(&netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: probe.Attrs().Index, Parent: netlink.HANDLE_ROOT}})
	_ = node.LinkDel(probe)
	netdevtest.SkipIfLacks(t, err, netdevtest.Qdisc("fq")) // then HTB is used instead
	s := b.add("edt", "200M", "", nil)
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); !hasKind(q, "fq") || hasKind(q, "htb") {
		t.Fatalf("parent qdiscs %v: want fq, not HTB", q)
	}
	goodput, _ := b.measure(bpf.Egress, []*share{s}, 3*time.Second)
	if ratio := goodput[0] / rate("200M"); ratio < 0.85 || ratio > 1.05 {
		t.Errorf("EDT share of 200M: goodput ratio %.3f", ratio)
	}
}

package netdev_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
)

// Two shares of one parent at once, each held to its own rate in both
// directions: goodput within ±10% of 0.956 of the allocation at 50M, 200M
// and 1G.
func TestSharesHoldTheirRates(t *testing.T) {
	b := newBench(t)
	for r, round := range [][2]string{{"50M", "200M"}, {"1G", "200M"}} {
		if round[0] == "1G" && nettest.Emulated() != "" {
			// An emulated guest's TCP reached 0.42–0.81 of it: the
			// sender, not the share, is the limit there.
			t.Logf("1G round not run: a make vmtest guest (%s) cannot send 1 Gbit/s", nettest.Emulated())
			continue
		}
		shares := []*share{b.add(fmt.Sprintf("a%d", r), round[0], round[0], nil), b.add(fmt.Sprintf("b%d", r), round[1], round[1], nil)}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			// 1.2 Gbit/s of TCP is near what 2 vCPUs can send: where
			// other tests' packages run beside this one (make test), a
			// sender starved of CPU once read 0.89 of its 200M share.
			// A share short of its limit is measured once more, and
			// only the second measurement is judged; a share over
			// its limit fails at once.
			for attempt := 1; ; attempt++ {
				goodput, l2 := b.measure(dir, shares, 3*time.Second)
				var short []string
				for i, limit := range round {
					l2Ratio, gpRatio := l2[i]/rate(limit), goodput[i]/rate(limit)
					t.Logf("%s %s share of %s, measurement %d: L2 %.1f Mbit/s (ratio %.3f), goodput %.1f Mbit/s (ratio %.3f)",
						dir, []string{"first", "second"}[i], limit, attempt, l2[i]/1e6, l2Ratio, goodput[i]/1e6, gpRatio)
					// The classifier counts frames before the share's
					// queue, so L2 includes what its bounded leaf dropped
					// and TCP resent; goodput is what the share delivered
					// (0.956 of the rate is the limit met to within 1%).
					lo, hi := nettest.GoodputBand(0.956*0.9, 0.956*1.1)
					if gpRatio > hi {
						t.Errorf("%s share of %s: goodput ratio %.3f is over %.3f", dir, limit, gpRatio, hi)
					}
					if gpRatio < lo || l2Ratio < 0.9 {
						short = append(short, fmt.Sprintf("%s share of %s: goodput ratio %.3f is under %.3f, or L2 ratio %.3f under 0.9", dir, limit, gpRatio, lo, l2Ratio))
					}
				}
				if len(short) == 0 {
					break
				}
				if attempt == 2 {
					for _, msg := range short {
						t.Error(msg)
					}
					break
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

// A limited share is held on the parent's egress shaper while the parent's
// root qdisc stays as the kernel made it, and only the share's frames take
// the shaper: the node's own traffic on the parent does not.
func TestParentRootUntouchedWhileShaped(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	roots := func() []string {
		t.Helper()
		qs, err := node.QdiscList(parent)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, q := range qs {
			out = append(out, fmt.Sprintf("%s %x parent %x", q.Type(), q.Attrs().Handle, q.Attrs().Parent))
		}
		return out
	}
	before := roots()
	s := b.add("held", "200M", "", nil)
	after := roots()
	if nettest.LacksTCX(t) { // before 6.6 the classifier hangs on a clsact beside the root
		after = slices.DeleteFunc(after, func(q string) bool { return strings.HasPrefix(q, "clsact ") })
	}
	if !slices.Equal(after, before) {
		t.Errorf("parent's qdiscs %v while a share is shaped, were %v", after, before)
	}
	shaper, err := node.LinkByName(fmt.Sprintf("cveg%d", parent.Attrs().Index))
	if err != nil {
		t.Fatalf("no egress shaper: %v", err)
	}
	// What the shaper's HTB has sent, from its qdisc's counters.
	shaped := func() uint64 {
		t.Helper()
		qs, _ := node.QdiscList(shaper)
		for _, q := range qs {
			if q.Type() == "htb" && q.Attrs().Statistics != nil && q.Attrs().Statistics.Basic != nil {
				return q.Attrs().Statistics.Basic.Bytes
			}
		}
		t.Fatalf("no HTB with counters on the egress shaper: %v", qs)
		return 0
	}
	sent := shaped()
	goodput, l2 := b.measure(bpf.Egress, []*share{s}, 3*time.Second)
	lo, hi := nettest.GoodputBand(0.956*0.9, 0.956*1.1)
	if ratio := goodput[0] / rate("200M"); ratio < lo || ratio > hi {
		t.Errorf("share of 200M: goodput ratio %.3f, want %.3f–%.3f", ratio, lo, hi)
	}
	// The classifier counted l2 over the 3 s window; the shaper saw the
	// warm-up too.
	if through, counted := float64(shaped()-sent), l2[0]*3/8; through < 0.99*counted {
		t.Errorf("the shaper sent %.0f bytes, the classifier counted %.0f for the share: its frames did not all take the shaper", through, counted)
	}

	addr, _ := netlink.ParseAddr("10.77.0.250/24") // the node's own address
	if err := node.AddrAdd(parent, addr); err != nil {
		t.Fatal(err)
	}
	// The share's flow has drained from the shaper before the node's
	// own flow starts: in an emulated guest its tail took the first
	// 100 ms of that flow (2.1 MB of 83 MB, make vmtest).
	for last, deadline := shaped(), time.Now().Add(5*time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		now := shaped()
		if now == last {
			break
		}
		last = now
	}
	sent = shaped()
	hostFlow := []nettest.Flow{{From: b.tp.Node, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":5301"}}
	res, err := nettest.RunFlows(hostFlow, 0, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Bytes == 0 {
		t.Fatal("the node's own flow carried nothing")
	}
	if n := shaped() - sent; n > uint64(res[0].Bytes)/100 {
		t.Errorf("%d bytes of the node's own %d took the shaper", n, res[0].Bytes)
	}
}

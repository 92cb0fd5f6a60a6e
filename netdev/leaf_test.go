package netdev_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
)

// Every share's class has a bounded queue of its own: fq_codel where the
// kernel has it, else a bfifo of about 50 ms of the share's rate (never
// under one 64 KiB super-packet and a frame), behind a splitting tbf for
// the bulk children (flows.go), not HTB's default 1000-frame FIFO (1.2 s at
// 10M).
func TestShareClassesHaveBoundedLeaves(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	var bursts []int // every share's so far: they share the devices
	for _, c := range []struct {
		rate  string
		bytes int
	}{{"10M", 65536 + 1514}, {"400M", 400e6 / 8 * 50 / 1000}} {
		b.add("leaf"+c.rate, c.rate, c.rate, nil)
		bursts = append(bursts, max(int(rate(c.rate))/8/1000, 2*1518))
		parent, _ := node.LinkByName(b.tp.Parent)
		ifb, err := node.LinkByName(fmt.Sprintf("cvifb%d", parent.Attrs().Index))
		if err != nil {
			t.Fatal(err)
		}
		for _, dev := range []string{fmt.Sprintf("cveg%d", parent.Attrs().Index), ifb.Attrs().Name} {
			out, err := b.tp.Exec("node", "tc", "qdisc", "show", "dev", dev).CombinedOutput()
			if err != nil {
				t.Fatalf("tc: %v: %s", err, out)
			}
			classes := len(regexp.MustCompile(`(?m)^qdisc \S+ \S+ parent 1:`).FindAll(out, -1))
			leaves := regexp.MustCompile(`(?m)^qdisc (fq_codel|bfifo|tbf) \S+ parent 1:\S+ (?:limit (\d+)b)?`).FindAllSubmatch(out, -1)
			if len(leaves) == 0 || len(leaves) != classes {
				t.Fatalf("%s: want a bounded leaf under every class:\n%s", dev, out)
			}
			// An fq_codel leaf's quantum is a frame, not its device's
			// MTU (the egress shaper's is 65535: leaf.go).
			for _, m := range regexp.MustCompile(`(?m)^qdisc fq_codel \S+ parent 1:\S+ .*quantum (\d+)b?`).FindAllSubmatch(out, -1) {
				if q, _ := strconv.Atoi(string(m[1])); q != 1514 {
					t.Errorf("%s: an fq_codel leaf with a quantum of %d bytes, want 1514:\n%s", dev, q, out)
				}
			}
			found := false
			for _, l := range leaves {
				if string(l[1]) == "fq_codel" {
					found = true
					continue
				}
				if string(l[1]) == "tbf" {
					continue // checked below
				}
				if n, _ := strconv.Atoi(string(l[2])); n == c.bytes {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no leaf for the %s share with a limit of %d bytes:\n%s", dev, c.rate, c.bytes, out)
			}
			// The bulk children's splitting leaves let a super-packet
			// through whole only under a millisecond of the rate (two
			// frames at least): 10M splits every one.
			for _, m := range regexp.MustCompile(`(?m)^qdisc tbf \S+ parent 1:\S+ rate \S+ burst (\d+)([Kk]?)b`).FindAllSubmatch(out, -1) {
				burst, _ := strconv.Atoi(string(m[1]))
				if len(m[2]) > 0 {
					burst *= 1024
				}
				if !slices.ContainsFunc(bursts, func(want int) bool { return burst > want*98/100-64 && burst < want*102/100+64 }) {
					t.Errorf("%s: a splitting leaf with a burst of %d bytes, want about one of %v:\n%s", dev, burst, bursts, out)
				}
			}
		}
	}
}

package netdev_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// TestBorrowingSharesOnAndOff (issue 42; make soak, CARVE_BORROW_SOAK=1):
// 20 shares of mixed floors and ceilings on a 1G link switch their one TCP
// flow each on and off at random for 60 s (on 1–6 s, off 0.5–3 s). In every
// whole second a share sends throughout, its class sends at least its floor
// within 1% and at most its ceiling within 1%, at L2 as HTB counts it; over the seconds in which
// every sending share is saturated (their floors plus what the link has
// left), Jain's index over excess/floor must be at least 0.95. Egress.
func TestBorrowingSharesOnAndOff(t *testing.T) {
	if os.Getenv("CARVE_BORROW_SOAK") == "" {
		t.Skip("set CARVE_BORROW_SOAK=1 to run (make soak)")
	}
	b := newBench(t)
	b.dev.Device = linkCapacity("1G")
	type member struct {
		s           *share
		floor, ceil float64
	}
	var members []member
	floors := []string{"10M", "20M", "30M", "50M"}
	ceilings := []string{"100M", "200M", "500M", "1G"}
	for i := range 20 {
		f, c := floors[i%4], ceilings[(i/4)%4]
		s := b.add(fmt.Sprintf("onoff%02d", i), f, "", &v1alpha1.NetworkConfig{Pools: []string{"test"}, MaxCeiling: "link", EgressCeiling: c})
		members = append(members, member{s: s, floor: rate(f), ceil: rate(c)})
	}
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	shaper, err := node.LinkByName(netdev.EgressShaperName(parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	var shares []nettest.OnOffShare
	minors := make([]uint32, len(members))
	for i, m := range members {
		rec, err := netdev.DecodeShareRecord(m.s.undo)
		if err != nil {
			t.Fatal(err)
		}
		minors[i] = netdev.ClassHandle(rec.EgressMinor)
		shares = append(shares, nettest.OnOffShare{Flow: nettest.Flow{From: m.s.pod, To: b.tp.Server, ToAddr: fmt.Sprintf("%s:%d", b.tp.ServerIP, 5400+i)},
			Floor: m.floor, Ceil: m.ceil})
	}
	// What each share's class sent, at L2 as HTB counts it (the
	// classifier counts frames as they are queued, and a GSO
	// super-packet's headers once).
	res, err := nettest.RunOnOff(shares, 60*time.Second, 1e9, nettest.ClassBytes(node, shaper, minors))
	if err != nil {
		t.Fatal(err)
	}
	checkOnOff(t, res)
}

// checkOnOff fails t on res's floor misses and ceiling overruns, and on a
// saturated second whose Jain's index over excess/floor is under 0.95
// (issue 42; the excess is assured by rate since, excess.go: before, the
// worst second read 0.918).
func checkOnOff(t *testing.T, res nettest.OnOffResult) {
	t.Logf("%d seconds with shares sending; %d floor misses, %d ceiling overruns; Jain's index over excess/floor in %d saturated seconds: min %.3f, median %.3f",
		res.Seconds, len(res.Under), len(res.Over), len(res.Jains), first(res.Jains), median(res.Jains))
	if len(res.Under) > 0 {
		t.Errorf("floors missed in whole seconds of sending:\n%s", strings.Join(res.Under, "\n"))
	}
	if len(res.Over) > 0 {
		t.Errorf("ceilings overrun:\n%s", strings.Join(res.Over, "\n"))
	}
	if len(res.Jains) > 0 && first(res.Jains) < 0.95 {
		t.Errorf("Jain's index over excess/floor: %.3f in the worst saturated second (median %.3f), want at least 0.95 in every one", first(res.Jains), median(res.Jains))
	}
}

func first(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[0]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

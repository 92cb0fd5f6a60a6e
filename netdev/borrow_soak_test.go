package netdev_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
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
	const run = 60 * time.Second
	start := time.Now()
	// sending[i][sec] says share i sent for all of second sec.
	sending := make([][]bool, len(members))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, m := range members {
		sending[i] = make([]bool, int(run/time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7)) //nolint:gosec // G404: a schedule repeatable from its seed, no secret
			port := 5400 + i
			for time.Since(start) < run-2*time.Second {
				time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond)
				on := time.Duration(1000+r.IntN(5000)) * time.Millisecond
				from := time.Since(start)
				flow := nettest.Flow{From: m.s.pod, To: b.tp.Server, ToAddr: fmt.Sprintf("%s:%d", b.tp.ServerIP, port)}
				if _, err := nettest.RunFlows([]nettest.Flow{flow}, 0, on, nil); err != nil {
					t.Error(err)
					return
				}
				to := time.Since(start)
				mu.Lock()
				// Whole seconds inside the flow, after its first
				// 300 ms (slow start).
				for sec := int((from + 1300*time.Millisecond) / time.Second); sec+1 <= int(to/time.Second) && sec < len(sending[i]); sec++ {
					sending[i][sec] = true
				}
				mu.Unlock()
			}
		}()
	}
	// What each share's class sent, at L2 as HTB counts it (the
	// classifier counts frames as they are queued, and a GSO
	// super-packet's headers once), once a second.
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
	minors := make([]uint32, len(members))
	for i, m := range members {
		rec, err := netdev.DecodeShareRecord(m.s.undo)
		if err != nil {
			t.Fatal(err)
		}
		minors[i] = netdev.ClassHandle(rec.EgressMinor)
	}
	var counts []map[uint32]uint64
	for sec := 0; sec <= int(run/time.Second); sec++ {
		time.Sleep(time.Until(start.Add(time.Duration(sec) * time.Second)))
		classes, err := node.ClassList(shaper, netlink.MakeHandle(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		sent := map[uint32]uint64{}
		for _, c := range classes {
			if st := c.Attrs().Statistics; st != nil && st.Basic != nil {
				sent[c.Attrs().Handle] = st.Basic.Bytes
			}
		}
		counts = append(counts, sent)
	}
	wg.Wait()
	var under, over []string
	var jains []float64
	var seconds int
	for sec := 0; sec+1 < len(counts) && sec < int(run/time.Second); sec++ {
		var excess []float64
		var sum float64
		busy := 0
		for i, m := range members {
			got := float64(counts[sec+1][minors[i]]-counts[sec][minors[i]]) * 8
			sum += got
			if !sending[i][sec] {
				continue
			}
			busy++
			if got < 0.99*m.floor {
				under = append(under, fmt.Sprintf("s%d share %d: %.1f of floor %.0fM", sec, i, got/1e6, m.floor/1e6))
			}
			if got > 1.01*m.ceil {
				over = append(over, fmt.Sprintf("s%d share %d: %.1f over ceiling %.0fM", sec, i, got/1e6, m.ceil/1e6))
			}
			if got < 0.99*m.ceil {
				excess = append(excess, (got-m.floor)/m.floor)
			}
		}
		if busy > 0 {
			seconds++
		}
		// Saturated: the link full, so every share below its ceiling
		// wanted more than it got.
		if sum >= 0.95e9 && len(excess) >= 2 {
			jains = append(jains, nettest.Jain(excess))
		}
	}
	sort.Float64s(jains)
	t.Logf("%d seconds with shares sending; %d floor misses, %d ceiling overruns; Jain's index over excess/floor in %d saturated seconds: min %.3f, median %.3f",
		seconds, len(under), len(over), len(jains), first(jains), median(jains))
	if len(under) > 0 {
		t.Errorf("floors missed in whole seconds of sending:\n%s", strings.Join(under, "\n"))
	}
	if len(over) > 0 {
		t.Errorf("ceilings overrun:\n%s", strings.Join(over, "\n"))
	}
	// Every saturated second (issue 42); the excess is assured by rate
	// since (excess.go): before, the worst second read 0.918.
	if len(jains) > 0 && first(jains) < 0.95 {
		t.Errorf("Jain's index over excess/floor: %.3f in the worst saturated second (median %.3f), want at least 0.95 in every one", first(jains), median(jains))
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

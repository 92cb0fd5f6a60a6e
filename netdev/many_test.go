package netdev_test

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

// TestManySharesHoldTheirRates (issue 37): N shares of 10M on one parent,
// all saturated at once by one TCP flow each, egress then ingress. Every
// share's goodput must be within ±1% of the L2 target (0.946–0.966 of its
// limit), and the shares must degrade evenly where the machine cannot carry
// them all (Jain's index over goodput/limit ≥ 0.99). N is
// CARVE_MANY_SHARES: make soak runs 100. make unit does not run it: its
// packages run two at a time beside it, and its figures would be theirs.
// make test runs it alone (make shares) at 100, past the knee where the
// shaped path's CPU cost once broke it (0–22 of 100 within ±1%), with
// CARVE_MANY_SHARES_WITHIN=0.9: the fraction of the shares that must be
// within ±1% (all, unless set), a bar under the goal that such a
// regression cannot pass; Jain's index is held to 0.99 either way. The
// real node's run is deploy/e2e's TestNodeManySharePods (make soak). With
// CARVE_MANY_SHARES_COMPARE set, the same N shares of the design before
// flow isolation (plain HTB classes, one FIFO each) run first, and the CPU
// each design takes per shaped Gbit/s is compared (make soak sets it).
func TestManySharesHoldTheirRates(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CARVE_MANY_SHARES"))
	if n <= 0 {
		t.Skip("set CARVE_MANY_SHARES=N to run (make soak)")
	}
	bar := manyBar{within: n}
	if v := os.Getenv("CARVE_MANY_SHARES_WITHIN"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			t.Fatalf("CARVE_MANY_SHARES_WITHIN=%q: want the fraction of shares that must be within ±1%%, from 0 to 1", v)
		}
		bar.within = int(math.Ceil(f * float64(n)))
	}
	if v := os.Getenv("CARVE_MANY_SHARES_LOW"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 0.956 {
			t.Fatalf("CARVE_MANY_SHARES_LOW=%q: want the goodput/limit nine in ten shares must reach, over 0 and at most 0.956 (the rate met)", v)
		}
		bar.low = f
	}
	var table strings.Builder
	table.WriteString("| design | N | direction | within ±1% | min | max | Jain | CPU idle | CPU s per Gbit |\n|---|---|---|---|---|---|---|---|---|\n")
	perGbit := map[string]map[bpf.Direction]float64{}
	if os.Getenv("CARVE_MANY_SHARES_COMPARE") != "" {
		// The design before flow isolation first, in the same run: the
		// reference for the CPU a shaped Gbit/s costs (issue 37).
		t.Run("plain", func(t *testing.T) {
			b := newBench(t)
			netdev.PlainQueues(b.p)
			perGbit["plain"] = runManyShares(t, b, n, "plain", nil, &table)
		})
	}
	perGbit["carve"] = runManyShares(t, newBench(t), n, "carve", &bar, &table)
	t.Logf("%d shares of 10M saturated at once:\n%s", n, table.String())
	if plain := perGbit["plain"]; plain != nil {
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			t.Logf("%s: CPU per shaped Gbit/s, carve's design over the plain one's: %.2f", dir, perGbit["carve"][dir]/plain[dir])
		}
	}
}

// runManyShares prepares n shares of 10M on b and saturates them at once,
// egress then ingress, adding a row a direction to table, and returns the
// machine's CPU seconds per shaped Gbit/s by direction. Where want is not
// 0, fewer than want shares within ±1%, or Jain's index under 0.99, fail
// the test.
// manyBar is what the run must meet: within, the shares within ±1% of
// their rate; low, where set, the goodput/limit that nine shares in ten
// reach at least. make test holds the second: on this machine kind 100
// shares are at the knee, and a run on a slower one read every share
// 0.907-0.945, evenly (Jain 0.9999), 0 of 100 within ±1%; the regression
// it guards against read 0.52-0.96 and 0-22 within.
type manyBar struct {
	within int
	low    float64
}

func runManyShares(t *testing.T, b *bench, n int, design string, bar *manyBar, table *strings.Builder) map[bpf.Direction]float64 {
	shares := make([]*share, n)
	for i := range shares {
		shares[i] = b.add(fmt.Sprintf("m%03d", i), "10M", "10M", nil)
	}
	out := map[bpf.Direction]float64{}
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		idle0, total0 := cpuTimes(t)
		// A hundred flows take a few seconds to leave slow start on two
		// cores: the window opens after them.
		goodput, _ := b.measureAfter("tcp", dir, shares, 3*time.Second, 10*time.Second)
		idle1, total1 := cpuTimes(t)
		ratios := make([]float64, n)
		within := 0
		sum := 0.0
		for i, g := range goodput {
			ratios[i] = g / rate("10M")
			sum += g
			if ratios[i] >= 0.946 && ratios[i] <= 0.966 {
				within++
			}
		}
		sorted := append([]float64(nil), ratios...)
		sort.Float64s(sorted)
		j := nettest.Jain(ratios)
		busy := float64((total1-total0)-(idle1-idle0)) / 100 // USER_HZ
		idleFrac := float64(idle1-idle0) / float64(total1-total0)
		// The window is 10 s of the flows' 13 (3 s warm-up); the CPU
		// counters span both: scale the busy time to the window.
		out[dir] = busy * 10 / 13 / (sum / 1e9 * 10)
		fmt.Fprintf(table, "| %s | %d | %s | %d/%d | %.3f | %.3f | %.4f | %.2f | %.2f |\n", design, n, dir, within, n, sorted[0], sorted[n-1], j, idleFrac, out[dir])
		if bar == nil {
			continue
		}
		aqm, _ := b.shaper.AQM()
		drops := netdev.ClassDrops(b.p)
		for i, r := range ratios {
			if r < 0.946 || r > 0.966 {
				k := bpf.Key{MAC: shares[i].mac, Dir: dir}
				t.Logf("%s share %d: goodput/limit %.3f, queue drops %d, AQM drops %d", dir, i, r, drops[k], aqm[k].Drops)
			}
		}
		if within < bar.within {
			t.Errorf("%s: %d of %d shares within ±1%% of their 10M (goodput/limit %.3f–%.3f), want at least %d", dir, within, n, sorted[0], sorted[n-1], bar.within)
		}
		if tenth := sorted[n/10]; bar.low > 0 && tenth < bar.low {
			t.Errorf("%s: the %dth lowest share's goodput/limit %.3f, want nine shares in ten at least %.3f", dir, n/10+1, tenth, bar.low)
		}
		if j < 0.99 {
			t.Errorf("%s: Jain's index %.4f over the shares' goodput/limit, want ≥ 0.99", dir, j)
		}
	}
	return out
}

// cpuTimes is nettest.CPUTimes, fatal on error.
func cpuTimes(t *testing.T) (idle, total uint64) {
	t.Helper()
	idle, total, err := nettest.CPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	return idle, total
}

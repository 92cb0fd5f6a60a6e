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
//
// With CARVE_MANY_SHARES_COMPARE set, the same N shares of the design
// before flow isolation (plain HTB classes, one FIFO each, PlainQueues) run
// first, on a bench of their own, as the reference of the same run; then
// carve's CPU per shaped Gbit/s may be at most maxCostRatio of the plain
// design's, and its mean goodput/limit at least minGoodputRatio of it, each
// way. CARVE_MANY_SHARES_WITHIN is the fraction of the shares that must be
// within ±1% (all, unless set). make test runs it (make shares) at 100 with
// the reference and CARVE_MANY_SHARES_WITHIN=0: 100 shares are this
// machine kind's knee, where how many shares stay within ±1% is the
// machine's speed, not carve's (MEASURED.md); the regression it guards
// against cost 3.3 times the plain design's CPU and split the shares
// unevenly (0.52–0.96 of their rate). make soak holds every share within
// ±1%. The real node's run is deploy/e2e's TestNodeManySharePods (make
// soak).
func TestManySharesHoldTheirRates(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CARVE_MANY_SHARES"))
	if n <= 0 {
		t.Skip("set CARVE_MANY_SHARES=N to run (make soak)")
	}
	within := n
	if v := os.Getenv("CARVE_MANY_SHARES_WITHIN"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			t.Fatalf("CARVE_MANY_SHARES_WITHIN=%q: want the fraction of shares that must be within ±1%%, from 0 to 1", v)
		}
		within = int(math.Ceil(f * float64(n)))
	}
	var table strings.Builder
	table.WriteString("| design | N | direction | within ±1% | min | max | mean | Jain | resent | CPU idle | CPU s per Gbit |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	var plain map[bpf.Direction]manyRow
	if os.Getenv("CARVE_MANY_SHARES_COMPARE") != "" {
		t.Run("plain", func(t *testing.T) {
			b := newBench(t)
			netdev.PlainQueues(b.p)
			plain = runManyShares(t, b, n, "plain", &table)
		})
	}
	carve := runManyShares(t, newBench(t), n, "carve", &table)
	// The senders' congestion control is the node's default, which new
	// namespaces take: under BBR a share's egress falls short at the knee
	// where CUBIC's does not (MEASURED.md).
	cc, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	t.Logf("%d shares of 10M saturated at once, senders' TCP %s:\n%s", n, strings.TrimSpace(string(cc)), table.String())
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		row := carve[dir]
		if row.within < within {
			t.Errorf("%s: %d of %d shares within ±1%% of their 10M (goodput/limit %.3f–%.3f), want at least %d", dir, row.within, n, row.min, row.max, within)
		}
		if row.jain < 0.99 {
			t.Errorf("%s: Jain's index %.4f over the shares' goodput/limit, want ≥ 0.99", dir, row.jain)
		}
		ref, ok := plain[dir]
		if !ok {
			continue
		}
		cost, goodput := row.cpuPerGbit/ref.cpuPerGbit, row.mean/ref.mean
		t.Logf("%s: carve's design over the plain one's, same run: CPU per shaped Gbit/s %.2f (goal %.2f, bar %.2f), mean goodput/limit %.3f (bar %.2f)", dir, cost, costGoal, maxCostRatio, goodput, minGoodputRatio)
		if cost > maxCostRatio {
			t.Errorf("%s: carve's CPU per shaped Gbit/s is %.2f times the plain design's in the same run (%.2f against %.2f s), want at most %.2f", dir, cost, row.cpuPerGbit, ref.cpuPerGbit, maxCostRatio)
		}
		if goodput < minGoodputRatio {
			t.Errorf("%s: carve's shares' mean goodput/limit is %.3f of the plain design's in the same run (%.3f against %.3f), want at least %.2f", dir, goodput, row.mean, ref.mean, minGoodputRatio)
		}
	}
}

// The bars against the plain design in the same run (make test). The goal
// of issue 37 is costGoal; this machine kind reads 0.89–1.32 there
// (MEASURED.md), and the regression that broke a hundred shares read 3.3.
// At the knee a slower machine of the same kind read carve's shares
// 0.855–0.895 of their rate, evenly, where a plain share reads at most
// 0.957: 0.91 of it at worst.
const (
	costGoal        = 1.15
	maxCostRatio    = 1.5
	minGoodputRatio = 0.85
)

// manyRow is one design's run in one direction: how many shares were
// within ±1% of their rate, their goodput/limit's least, most, mean and
// Jain's index, and the machine's CPU seconds per shaped Gbit/s.
type manyRow struct {
	within               int
	min, max, mean, jain float64
	cpuPerGbit           float64
	// resent is the senders' retransmitted payload over the window, as a
	// fraction of the shares' rate, averaged over the shares: what the
	// rate carried twice and goodput lost.
	resent float64
}

// runManyShares prepares n shares of 10M on b and saturates them at once,
// egress then ingress, adding a row a direction to table and logging the
// shares out of ±1% with their drops.
func runManyShares(t *testing.T, b *bench, n int, design string, table *strings.Builder) map[bpf.Direction]manyRow {
	shares := make([]*share, n)
	for i := range shares {
		shares[i] = b.add(fmt.Sprintf("m%03d", i), "10M", "10M", nil)
	}
	out := map[bpf.Direction]manyRow{}
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		idle0, total0 := cpuTimes(t)
		// A hundred flows take a few seconds to leave slow start on two
		// cores: the window opens after them.
		res, _ := b.measureTCP(dir, shares, 3*time.Second, 10*time.Second)
		idle1, total1 := cpuTimes(t)
		ratios := make([]float64, n)
		retrans := make([]float64, n)
		var row manyRow
		sum, resent := 0.0, 0.0
		for i, r := range res {
			g := r.Goodput()
			ratios[i] = g / rate("10M")
			retrans[i] = float64(r.Retransmitted) * 8 / r.Duration.Seconds() / rate("10M")
			sum += g
			resent += retrans[i]
			if ratios[i] >= 0.946 && ratios[i] <= 0.966 {
				row.within++
			}
		}
		sorted := append([]float64(nil), ratios...)
		sort.Float64s(sorted)
		row.min, row.max, row.mean = sorted[0], sorted[n-1], sum/rate("10M")/float64(n)
		row.jain = nettest.Jain(ratios)
		row.resent = resent / float64(n)
		busy := float64((total1-total0)-(idle1-idle0)) / 100 // USER_HZ
		idleFrac := float64(idle1-idle0) / float64(total1-total0)
		// The window is 10 s of the flows' 13 (3 s warm-up); the CPU
		// counters span both: scale the busy time to the window.
		row.cpuPerGbit = busy * 10 / 13 / (sum / 1e9 * 10)
		out[dir] = row
		fmt.Fprintf(table, "| %s | %d | %s | %d/%d | %.3f | %.3f | %.3f | %.4f | %.4f | %.2f | %.2f |\n", design, n, dir, row.within, n, row.min, row.max, row.mean, row.jain, row.resent, idleFrac, row.cpuPerGbit)
		aqm, _ := b.shaper.AQM()
		drops := netdev.ClassDrops(b.p)
		for i, r := range ratios {
			if r < 0.946 || r > 0.966 {
				k := bpf.Key{MAC: shares[i].mac, Dir: dir}
				t.Logf("%s %s share %d: goodput/limit %.3f, resent/limit %.4f, RTOs %d (%v), queue drops %d, AQM drops %d", design, dir, i, r, retrans[i], res[i].RTOs, res[i].RTOTime, drops[k], aqm[k].Drops)
			}
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

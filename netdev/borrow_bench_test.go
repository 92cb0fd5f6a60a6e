package netdev_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// BenchmarkBorrowing is issue 42's rows for make bench, each beside the same
// shares as hard caps in the same run, on a NIC published at 1G, TCP, rates
// at L2 (the classifier's bytes over limitMet, as the tests read them), one
// measurement of 3 s after a 3 s warm-up an iteration:
//
//   - pair: floors 100M and 300M with ceilings at the link, both saturated:
//     each share's rate over its floor (≥ 0.99), their sum over the link
//     (≥ 0.95), and the excess split (100M's over 300M's; the floors say
//     0.333). The reference: the same two as hard caps, each over its limit.
//   - alone: the 100M borrower by itself, over its ceiling (the link); the
//     reference: the 100M hard cap alone, over its limit.
//   - udpflood (egress): the 300M TCP borrower beside a 100M borrower
//     flooding UDP (iperf3 offering 2G), over its floor; the reference:
//     the 300M hard cap beside the 100M hard cap flooding.
func BenchmarkBorrowing(b *testing.B) {
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		b.Run(fmt.Sprintf("pair/%s", dir), func(b *testing.B) { borrowPair(b, dir) })
		b.Run(fmt.Sprintf("alone/%s", dir), func(b *testing.B) { borrowAlone(b, dir) })
	}
	b.Run("udpflood/egress", borrowUDPFlood)
}

// borrowBench is two benches, each a node with a NIC of 1G: on env a
// borrowing share of each floor, on capEnv a hard-capped one. Each NIC's
// shares are alone on it, as the rows say: a share idle beside borrowers
// has its floor lent round-robin to whichever has a queue at its turn, not
// in proportion to their floors (excess.go).
func borrowBench(b *testing.B, floors ...string) (borrowers, caps []*share, env, capEnv *bench) {
	env, capEnv = newBench(b), newBench(b)
	env.dev.Device = linkCapacity("1G")
	capEnv.dev.Device = linkCapacity("1G")
	for i, f := range floors {
		borrowers = append(borrowers, env.add(fmt.Sprintf("borrow%d", i), f, f, &v1alpha1.NetworkConfig{Pools: []string{"test"}, MaxCeiling: "link"}))
		caps = append(caps, capEnv.add(fmt.Sprintf("cap%d", i), f, f, nil))
	}
	return borrowers, caps, env, capEnv
}

func borrowPair(b *testing.B, dir bpf.Direction) {
	borrowers, caps, env, capEnv := borrowBench(b, "100M", "300M")
	floors := []float64{100e6, 300e6}
	var over, capped [2]float64
	var sum, split float64
	for b.Loop() {
		_, l2 := env.measureAfter("tcp", dir, borrowers, 3*time.Second, 3*time.Second)
		lo, hi := l2[0]/limitMet, l2[1]/limitMet
		over[0] += lo / floors[0]
		over[1] += hi / floors[1]
		sum += (lo + hi) / 1e9
		split += (lo - floors[0]) / (hi - floors[1])
		_, ref := capEnv.measureAfter("tcp", dir, caps, time.Second, 3*time.Second)
		capped[0] += ref[0] / floors[0]
		capped[1] += ref[1] / floors[1]
	}
	n := float64(b.N)
	b.ReportMetric(over[0]/n, "floor100-l2-ratio")
	b.ReportMetric(over[1]/n, "floor300-l2-ratio")
	b.ReportMetric(sum/n, "sum-of-link")
	b.ReportMetric(split/n, "excess-split")
	b.ReportMetric(capped[0]/n/limitMet, "hardcap100-l2-ratio")
	b.ReportMetric(capped[1]/n/limitMet, "hardcap300-l2-ratio")
}

func borrowAlone(b *testing.B, dir bpf.Direction) {
	borrowers, caps, env, capEnv := borrowBench(b, "100M")
	var alone, capped float64
	for b.Loop() {
		_, l2 := env.measureAfter("tcp", dir, borrowers, 3*time.Second, 3*time.Second)
		alone += l2[0] / limitMet / 1e9
		_, ref := capEnv.measureAfter("tcp", dir, caps, time.Second, 3*time.Second)
		capped += ref[0] / limitMet / 100e6
	}
	n := float64(b.N)
	b.ReportMetric(alone/n, "of-ceiling-l2")
	b.ReportMetric(capped/n, "hardcap100-l2-ratio")
}

func borrowUDPFlood(b *testing.B) {
	borrowers, caps, env, capEnv := borrowBench(b, "100M", "300M")
	var floor, capped float64
	for b.Loop() {
		floor += env.tcpBesideFlood(b, borrowers[0], borrowers[1]) / 300e6
		capped += capEnv.tcpBesideFlood(b, caps[0], caps[1]) / 300e6
	}
	n := float64(b.N)
	b.ReportMetric(floor/n, "floor300-l2-ratio")
	b.ReportMetric(capped/n, "hardcap300-l2-ratio")
}

// tcpBesideFlood is tcp's egress rate at L2, bits/s, while flooder's pod
// floods UDP at 2G.
func (env *bench) tcpBesideFlood(b *testing.B, flooder, tcp *share) float64 {
	type result struct{ err error }
	done := make(chan result, 1)
	go func() {
		_, err := nettest.RunIperfUDP([]nettest.Flow{{From: flooder.pod, To: env.tp.Server, ToAddr: env.tp.ServerIP + ":5311"}}, 1472, []float64{2e9}, time.Second, 5*time.Second, nil)
		done <- result{err}
	}()
	time.Sleep(1500 * time.Millisecond)
	var marks []map[bpf.Key]bpf.Counters
	res, err := nettest.RunFlows([]nettest.Flow{{From: tcp.pod, To: env.tp.Server, ToAddr: env.tp.ServerIP + ":5312"}}, time.Second, 2*time.Second, env.marker(&marks))
	if err != nil {
		b.Fatal(err)
	}
	if r := <-done; r.err != nil {
		b.Fatal(r.err)
	}
	k := bpf.Key{MAC: tcp.mac, Dir: bpf.Egress}
	return float64(marks[1][k].Bytes-marks[0][k].Bytes) * 8 / res[0].Duration.Seconds() / limitMet
}

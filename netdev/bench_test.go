package netdev_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf"
)

// BenchmarkConformance measures how well shares are held to their
// allocation: achieved/allocated at L2 (the classifier's frame bytes) and as
// goodput, for TCP and UDP, egress and ingress, one share and two at once.
// Each iteration is one 2-second measurement.
func BenchmarkConformance(b *testing.B) {
	for _, proto := range []string{"tcp", "udp"} {
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			for _, limits := range [][]string{{"50M"}, {"200M"}, {"1G"}, {"200M", "1G"}} {
				name := fmt.Sprintf("%s/%s/%dshare/%s", proto, dir, len(limits), strings.Join(limits, "+"))
				b.Run(name, func(b *testing.B) { conformance(b, proto, dir, limits) })
			}
		}
	}
}

func conformance(b *testing.B, proto string, dir bpf.Direction, limits []string) {
	env := newBench(b)
	var shares []*share
	for i, l := range limits {
		shares = append(shares, env.add(fmt.Sprintf("s%d", i), l, l, nil))
	}
	var l2Sum, gpSum []float64
	for b.Loop() {
		var goodput, l2 []float64
		goodput, l2 = env.measureProto(proto, dir, shares, 2*time.Second)
		if l2Sum == nil {
			l2Sum, gpSum = make([]float64, len(l2)), make([]float64, len(l2))
		}
		for i := range l2 {
			l2Sum[i] += l2[i] / rate(limits[i])
			gpSum[i] += goodput[i] / rate(limits[i])
		}
	}
	n := float64(b.N)
	for i := range limits {
		b.ReportMetric(l2Sum[i]/n, fmt.Sprintf("share%d-l2-ratio", i+1))
		b.ReportMetric(gpSum[i]/n, fmt.Sprintf("share%d-goodput-ratio", i+1))
		b.ReportMetric(gpSum[i]/n*rate(limits[i])/1e6, fmt.Sprintf("share%d-goodput-Mbps", i+1))
	}
}

// BenchmarkUnlimitedShare compares a share with no bandwidth limit, on a
// parent whose egress runs carve's HTB and classifier for another share,
// with the same macvlan on a parent without them: the cost of enforcement
// to traffic that is not limited.
func BenchmarkUnlimitedShare(b *testing.B) {
	for _, withCarve := range []bool{false, true} {
		b.Run(map[bool]string{false: "no-bpf", true: "carve"}[withCarve], func(b *testing.B) {
			env := newBench(b)
			if withCarve {
				env.add("limited", "200M", "200M", nil)
			}
			free := env.add("free", "", "", nil)
			var sum float64
			for b.Loop() {
				goodput, _ := env.measure(bpf.Egress, []*share{free}, 2*time.Second)
				sum += goodput[0]
			}
			b.ReportMetric(sum/float64(b.N)/1e9, "Gbps")
		})
	}
}

// BenchmarkPrepareNetworkClaim is the latency of preparing and unpreparing
// one bandwidth share: interface, address, HTB classes in both directions,
// classifier entries and the attach spec.
func BenchmarkPrepareNetworkClaim(b *testing.B) {
	env := newBench(b)
	ctx := context.Background()
	var prep, unprep []time.Duration
	i := 0
	for b.Loop() {
		s := env.alloc(fmt.Sprintf("p%d", i), "100M", "100M")
		i++
		t0 := time.Now()
		prepared, err := env.p.Prepare(ctx, s, env.dev)
		prep = append(prep, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		if err := env.p.Unprepare(ctx, s, prepared.Undo); err != nil {
			b.Fatal(err)
		}
		unprep = append(unprep, time.Since(t0))
	}
	for name, d := range map[string][]time.Duration{"prepare": prep, "unprepare": unprep} {
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, name+"-p99-ms")
	}
}

package netdev_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
)

// BenchmarkConformance measures how well shares are held to their
// allocation: achieved/allocated at L2 (the classifier's frame bytes) and as
// goodput, for TCP and UDP, egress and ingress, one share and two at once.
// Each iteration is one 2-second measurement. UDP is sent by iperf3,
// offering 1.2 times each share's limit; the offered rate is reported beside
// every UDP figure (offered-ratio, of the limit, in payload bits), and a
// case whose sender offered less than the limit while the share's class ran
// below its rate is marked generator-bound (1): its figures measure the
// generator, not the shaper.
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
	l2Sum, gpSum, offSum := make([]float64, len(limits)), make([]float64, len(limits)), make([]float64, len(limits))
	for b.Loop() {
		var goodput, l2, offered []float64
		if proto == "udp" {
			want := make([]float64, len(limits))
			for i, l := range limits {
				want[i] = 1.2 * rate(l)
			}
			var res []nettest.UDPResult
			res, l2 = env.measureUDP(dir, shares, want, 2*time.Second)
			for _, r := range res {
				goodput, offered = append(goodput, r.Received), append(offered, r.Offered)
			}
		} else {
			goodput, l2 = env.measureProto(proto, dir, shares, 2*time.Second)
		}
		for i := range l2 {
			l2Sum[i] += l2[i] / rate(limits[i])
			gpSum[i] += goodput[i] / rate(limits[i])
			if offered != nil {
				offSum[i] += offered[i] / rate(limits[i])
			}
		}
	}
	n := float64(b.N)
	for i := range limits {
		b.ReportMetric(l2Sum[i]/n, fmt.Sprintf("share%d-l2-ratio", i+1))
		b.ReportMetric(gpSum[i]/n, fmt.Sprintf("share%d-goodput-ratio", i+1))
		b.ReportMetric(gpSum[i]/n*rate(limits[i])/1e6, fmt.Sprintf("share%d-goodput-Mbps", i+1))
		if proto == "udp" {
			b.ReportMetric(offSum[i]/n, fmt.Sprintf("share%d-offered-ratio", i+1))
			// A local sender (and iperf3's pacing) is held back by
			// the very queue it fills, so an offered rate at the
			// limit is the shaper's doing. Generator-bound: the
			// sender offered less than the limit while the share's
			// class did not run at its rate.
			bound := 0.0
			if offSum[i]/n < 1 && l2Sum[i]/n < 0.98 {
				bound = 1
			}
			b.ReportMetric(bound, fmt.Sprintf("share%d-generator-bound", i+1))
		}
	}
}

// BenchmarkPrepareNetworkClaim is the latency of preparing and unpreparing
// one bandwidth share: interface, address, HTB classes in both directions,
// classifier entries and the attach spec. "steady" keeps another share on
// the parent throughout, so its egress shaper and IFB stay, as on a node running
// share pods; "first-share" prepares the parent's only share, making them,
// and lets the reaper remove them (untimed) before the next round.
// Percentiles come from at least 200 samples.
func BenchmarkPrepareNetworkClaim(b *testing.B) {
	for _, first := range []bool{false, true} {
		b.Run(map[bool]string{false: "steady", true: "first-share"}[first], func(b *testing.B) {
			env := newBench(b)
			ctx := context.Background()
			if !first {
				env.add("resident", "100M", "100M", nil)
			}
			var prep, unprep []time.Duration
			i := 0
			round := func() {
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
				if first {
					b.StopTimer()
					env.p.WaitReaped()
					b.StartTimer()
				}
			}
			for b.Loop() {
				round()
			}
			for len(prep) < 200 {
				round()
			}
			env.p.WaitReaped()
			for name, d := range map[string][]time.Duration{"prepare": prep, "unprepare": unprep} {
				slices.Sort(d)
				b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name+"-p50-ms")
				b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, name+"-p99-ms")
			}
			b.ReportMetric(float64(len(prep)), "samples")
		})
	}
}

// BenchmarkLatencyUnderLoad measures the round trip of small UDP probes
// through a share that a TCP flow or a UDP flood saturates, egress (the probes queue in
// the share's class on the parent's egress shaper) and ingress (on the IFB): the delay a
// share's own queue adds. It reports the median and p99 in ms and the
// number of probes lost.
func BenchmarkLatencyUnderLoad(b *testing.B) {
	for _, proto := range []string{"tcp", "udp"} {
		for _, limit := range []string{"10M", "100M"} {
			for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
				b.Run(fmt.Sprintf("%s/%s/%s", proto, dir, limit), func(b *testing.B) { latencyUnderLoad(b, proto, dir, limit) })
			}
		}
	}
}

func latencyUnderLoad(b *testing.B, proto string, dir bpf.Direction, limit string) {
	env := newBench(b)
	s := env.add("lat", limit, limit, nil)
	var p50, p99, lost float64
	for b.Loop() {
		load := nettest.Flow{From: s.pod, To: env.tp.Server, ToAddr: env.tp.ServerIP + ":5301"}
		from, to, echo := s.pod, env.tp.Server, env.tp.ServerIP+":5302"
		if dir == bpf.Ingress {
			load = nettest.Flow{From: env.tp.Server, To: s.pod, ToAddr: s.ip + ":5301"}
			// Probes from the pod; it is their replies that queue.
		}
		loaded := make(chan error, 1)
		go func() {
			run := nettest.RunFlows
			if proto == "udp" {
				run = func(f []nettest.Flow, warmup, d time.Duration, mark func()) ([]nettest.Result, error) {
					return nettest.RunUDP(f, 1400, warmup, d, mark)
				}
			}
			flows := []nettest.Flow{load}
			if proto == "udp" {
				// A local sender's socket buffer holds some 90
				// datagrams; a remote sender's is no limit. Twelve
				// sockets fill the queue as one remote sender would.
				host, port, _ := net.SplitHostPort(load.ToAddr)
				for i := 1; i < 12; i++ {
					f := load
					f.ToAddr = net.JoinHostPort(host, port[:2]+strconv.Itoa(10+i))
					flows = append(flows, f)
				}
			}
			_, err := run(flows, 0, 6*time.Second, nil)
			loaded <- err
		}()
		time.Sleep(time.Second) // the flow fills the share's queue
		rtts, l, err := nettest.EchoRTT(from, to, echo, 20*time.Millisecond, 3*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := <-loaded; err != nil {
			b.Fatal(err)
		}
		p50 += float64(nettest.Quantile(rtts, 0.5)) / 1e6
		p99 += float64(nettest.Quantile(rtts, 0.99)) / 1e6
		lost += float64(l)
	}
	n := float64(b.N)
	b.ReportMetric(p50/n, "rtt-p50-ms")
	b.ReportMetric(p99/n, "rtt-p99-ms")
	b.ReportMetric(lost/n, "probes-lost")
}

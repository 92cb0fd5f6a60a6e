package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

const (
	latParent   = "carve-e2l0"
	latServer   = "carve-e2l-srv"
	latServerIP = "10.78.0.1"
	latPort     = "5311"
)

// The node's TCP congestion control is the host's: this project's machines
// run bbr (net.ipv4.tcp_congestion_control), which keeps at least four
// segments in flight a flow; cubic and reno two.

// BenchmarkNodeLatencyUnderLoad is netdev's BenchmarkLatencyUnderLoad on
// the real node, as a user sees it: pods with a 10M and a 100M share (the
// chart's defaults, the real kubelet, containerd and carve's hook), iperf3
// inside a pod saturating its own share with 1, 8 or 32 TCP flows, or UDP
// at twice its rate, each way, against a server beside the node; busybox's
// ping from the same pod meanwhile (ICMP, one every 20 ms, after 4 s of
// load). It reports the ping's p50 and p99, the TCP senders' own RTT
// (iperf3's per-interval samples, p50; the server's for ingress), goodput
// over the limit and Jain's index over the flows (iperf3's receiver
// side), and the share's drops and CE marks as `carve shares` counts them.
func BenchmarkNodeLatencyUnderLoad(b *testing.B) {
	cs := client(b)
	env := clusterEnv(b)
	quietHost(b)
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	trafficServer(b, latParent, "carve-e2l1", latServer, latServerIP)
	// A server of its own that answers in JSON: --get-server-output then
	// brings the server's side, the sender's RTT for ingress, to the
	// client.
	srv := exec.Command("ip", "netns", "exec", latServer, "iperf3", "-s", "-J", "-p", latPort)
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	buildAgentImage(b, "carve:e2e")
	buildNetTestImage(b)
	installChart(b, env, stateDir, nicNodeConfig(latParent, "lat", "10.78.0.0/24", latServerIP, ""))
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["lat"],"interfaceName":"net1"}`
	pods := map[string]string{}
	for _, limit := range []string{"10M", "100M"} {
		pods[limit] = "lat-" + strings.ToLower(limit)
		sharePod{name: pods[limit], parent: latParent, capacity: bothWays(limit), netCfg: netCfg, image: "carve-net-test:e2e"}.start(b, cs)
	}
	for _, p := range pods {
		waitFor(b, "pod "+p, 90*time.Second, podRunning(cs, testNS, p))
	}
	for _, load := range []string{"idle", "tcp1", "tcp8", "tcp32", "udp2x"} {
		for _, limit := range []string{"10M", "100M"} {
			for _, dir := range []string{"egress", "ingress"} {
				b.Run(load+"/"+dir+"/"+limit, func(b *testing.B) {
					for b.Loop() {
						nodeLatencyCase(b, stateDir, pods[limit], load, dir, limit)
					}
				})
			}
		}
	}
}

func nodeLatencyCase(b *testing.B, stateDir, pod, load, dir, limit string) {
	const warm, measured = 4, 4 // seconds
	var loaded chan iperfRun
	if load != "idle" {
		args := []string{"-c", latServerIP, "-p", latPort, "-t", strconv.Itoa(warm + measured), "-O", strconv.Itoa(warm), "-J", "--get-server-output"}
		if load == "udp2x" {
			args = append(args, "-u", "-l", "1400", "-b", strconv.Itoa(int(2*rate(limit))))
		} else {
			args = append(args, "-P", strings.TrimPrefix(load, "tcp"))
		}
		if dir == "ingress" {
			args = append(args, "-R")
		}
		loaded = runIperf(pod, args)
	}
	before := shareCounters(b, stateDir, pod)
	time.Sleep(warm * time.Second)
	// What the shaper let out while the ping ran, inside iperf3's
	// counted seconds: the class's own count, which no receiver's
	// in-order bytes move (netdev's BenchmarkLatencyUnderLoad).
	out0, t0 := shaperSent(b, dir), time.Now()
	rtts := podPing(b, pod, latServerIP, 150)
	out1, t1 := shaperSent(b, dir), time.Now()
	var r iperfRun
	if loaded != nil {
		r = <-loaded
		if r.err != nil {
			b.Fatalf("iperf3 in %s: %v", pod, r.err)
		}
	}
	after := shareCounters(b, stateDir, pod)
	b.ReportMetric(float64(percentile(rtts, 0.5).Microseconds())/1000, "ping-p50-ms")
	b.ReportMetric(float64(percentile(rtts, 0.99).Microseconds())/1000, "ping-p99-ms")
	b.ReportMetric(float64(after.Drops-before.Drops), "drops")
	b.ReportMetric(float64(after.Marks-before.Marks), "marks")
	if strings.HasPrefix(load, "tcp") {
		b.ReportMetric(r.goodput/rate(limit), "goodput/limit")
		b.ReportMetric(float64(out1-out0)*8/t1.Sub(t0).Seconds()/rate(limit), "class-out/limit")
		b.ReportMetric(nettest.Jain(r.flows), "jain")
		b.ReportMetric(float64(percentile(r.rtts, 0.5).Microseconds())/1000, "bulk-srtt-p50-ms")
	}
}

// shaperSent is what the latency parent's shaper in direction dir (its
// egress shaper, its IFB) has let out of its top classes, in bytes as HTB
// counts frames: the link class, or the share classes where there is none.
// The other share on the parent is idle but for its ping meanwhile.
func shaperSent(b *testing.B, dir string) uint64 {
	b.Helper()
	parent, err := netlink.LinkByName(latParent)
	if err != nil {
		b.Fatal(err)
	}
	name := netdev.EgressShaperName(parent.Attrs().Index)
	if dir == "ingress" {
		name = netdev.IFBName(parent.Attrs().Index)
	}
	dev, err := netlink.LinkByName(name)
	if err != nil {
		b.Fatal(err)
	}
	classes, err := netlink.ClassList(dev, netlink.MakeHandle(1, 0))
	if err != nil {
		b.Fatal(err)
	}
	var sent uint64
	for _, c := range classes {
		if c.Attrs().Parent == netlink.HANDLE_ROOT && c.Attrs().Statistics != nil && c.Attrs().Statistics.Basic != nil {
			sent += c.Attrs().Statistics.Basic.Bytes
		}
	}
	return sent
}

// iperfRun is what an iperf3 client reported: goodput, each flow's, and
// the TCP senders' RTT samples (the server's where it sent).
type iperfRun struct {
	goodput float64
	flows   []float64
	rtts    []time.Duration
	err     error
}

// iperfReport is the part of iperf3's JSON read here.
type iperfReport struct {
	Intervals []struct {
		Sum     iperfInterval   `json:"sum"`
		Streams []iperfInterval `json:"streams"`
	} `json:"intervals"`
	ServerOutput *iperfReport `json:"server_output_json"`
}

// iperfInterval is one interval of one stream, or of all.
type iperfInterval struct {
	Bytes         float64 `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	BitsPerSecond float64 `json:"bits_per_second"`
	RTT           float64 `json:"rtt"` // µs, on the sending side
	Omitted       bool    `json:"omitted"`
	Sender        bool    `json:"sender"`
}

// receiver is the side of the report that received: the client's own
// intervals with -R, else the server's (--get-server-output, the server
// run with -J); nil where the report has neither.
//
// Goodput is read from the receiver's intervals, not from iperf3's end
// summary: with --omit the summary counts bytes of the omitted seconds
// against the measured ones (esnet/iperf#236, #443, #692). On the real
// node it read 1.02-1.08 of a 10M share's limit with 8 and 32 flows, and
// 0.976 of a 45M share's, while the share's class let out exactly its
// rate.
func (r *iperfReport) receiver() *iperfReport {
	for _, side := range []*iperfReport{r, r.ServerOutput} {
		if side == nil {
			continue
		}
		for _, iv := range side.Intervals {
			if !iv.Sum.Omitted {
				if !iv.Sum.Sender {
					return side
				}
				break
			}
		}
	}
	return nil
}

// rates is what the side received over its whole one-second intervals
// that were not omitted, in bits/s: in all, and by stream. iperf3 3.12
// reports the last omitted second as a measured interval of two seconds
// holding one second's bytes (read as half the rate), and ends with a
// partial interval: both are left out.
func (r *iperfReport) rates() (sum float64, streams []float64) {
	var bytes, secs float64
	var perBytes, perSecs []float64
	for _, iv := range r.Intervals {
		if iv.Sum.Omitted || iv.Sum.Seconds < 0.9 || iv.Sum.Seconds > 1.1 {
			continue
		}
		bytes += iv.Sum.Bytes
		secs += iv.Sum.Seconds
		for i, s := range iv.Streams {
			if i >= len(perBytes) {
				perBytes, perSecs = append(perBytes, 0), append(perSecs, 0)
			}
			perBytes[i] += s.Bytes
			perSecs[i] += s.Seconds
		}
	}
	if secs == 0 {
		return 0, nil
	}
	for i := range perBytes {
		if perSecs[i] > 0 {
			streams = append(streams, perBytes[i]*8/perSecs[i])
		}
	}
	return bytes * 8 / secs, streams
}

// runIperf runs iperf3 in the pod's main container with args.
func runIperf(pod string, args []string) chan iperfRun {
	ch := make(chan iperfRun, 1)
	go func() {
		out, err := exec.Command(kubectlPath(), append([]string{"--kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "exec", "-n", testNS, pod, "-c", "main", "--", "iperf3"}, args...)...).Output()
		if err != nil {
			ch <- iperfRun{err: fmt.Errorf("%v: %s", err, out)}
			return
		}
		var rep iperfReport
		if err := json.Unmarshal(out, &rep); err != nil {
			ch <- iperfRun{err: fmt.Errorf("iperf3 JSON: %v", err)}
			return
		}
		var r iperfRun
		if recv := rep.receiver(); recv != nil {
			r.goodput, r.flows = recv.rates()
		} else if !slices.Contains(args, "-u") {
			ch <- iperfRun{err: fmt.Errorf("iperf3 reported no receiver's intervals:\n%s", out)}
			return
		}
		sender := &rep
		if slices.Contains(args, "-R") && rep.ServerOutput != nil {
			sender = rep.ServerOutput
		}
		for _, iv := range sender.Intervals {
			for _, s := range iv.Streams {
				if !s.Omitted && s.RTT > 0 {
					r.rtts = append(r.rtts, time.Duration(s.RTT)*time.Microsecond)
				}
			}
		}
		if len(r.rtts) == 0 && !slices.Contains(args, "-u") {
			r.err = fmt.Errorf("iperf3 reported no RTT:\n%s", out)
		}
		ch <- r
	}()
	return ch
}

// podPing pings to from the pod, n times 20 ms apart, and returns the round
// trips; a lost probe counts as 1 s.
func podPing(b testing.TB, pod, to string, n int) []time.Duration {
	b.Helper()
	out, _ := exec.Command(kubectlPath(), "--kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "exec", "-n", testNS, pod, "-c", "main", "--",
		"ping", "-c", strconv.Itoa(n), "-i", "0.02", "-W", "1", to).CombinedOutput()
	var rtts []time.Duration
	for _, m := range regexp.MustCompile(`time=([0-9.]+) ms`).FindAllSubmatch(out, -1) {
		ms, _ := strconv.ParseFloat(string(m[1]), 64)
		rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
	}
	if len(rtts) < n/2 {
		b.Fatalf("ping from %s: %d replies of %d:\n%s", pod, len(rtts), n, out)
	}
	for len(rtts) < n {
		rtts = append(rtts, time.Second)
	}
	return rtts
}

// shareCounters are the pod's share's drops and marks, from `carve shares`.
func shareCounters(b *testing.B, stateDir, pod string) struct{ Drops, Marks uint64 } {
	b.Helper()
	all := allShareCounters(b, stateDir)
	c, ok := all[testNS+"/"+pod]
	if !ok {
		b.Fatalf("carve shares lists no share of %s: %v", pod, all)
	}
	return c
}

// allShareCounters are every share's drops and marks on the node, by claim
// (namespace/name), from `carve shares`.
func allShareCounters(t testing.TB, stateDir string) map[string]struct{ Drops, Marks uint64 } {
	t.Helper()
	out, err := exec.Command(carveBinary(t), "shares", "-o", "json", "--interval", "0s", "--state-dir", stateDir, "--bpf-pin-dir", e2ePins).Output()
	var rows []struct {
		Claim        string `json:"claim"`
		Drops, Marks uint64
	}
	if jerr := json.Unmarshal(bytes.TrimSpace(out), &rows); jerr != nil {
		t.Fatalf("carve shares: %v, %v: %s", err, jerr, out)
	}
	all := map[string]struct{ Drops, Marks uint64 }{}
	for _, r := range rows {
		c := all[r.Claim] // a share has a row per direction
		c.Drops += r.Drops
		c.Marks += r.Marks
		all[r.Claim] = c
	}
	return all
}

func kubectlPath() string {
	return filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "bin", "kubectl")
}

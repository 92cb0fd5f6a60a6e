package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	overParent = "carve-e2o0"
	overServer = "carve-e2o-srv"
	overIP     = "10.86.0.1"
)

// overRateShares are issue 37's three shares of unlike rates on one parent,
// one of which once read 0.976 of its limit: a leak, or a measure that
// counted what the window did not hold.
var overRateShares = []struct{ pod, limit, port string }{
	{"ov45", "45M", "5201"},
	{"ov130", "130M", "5202"},
	{"ov730", "730M", "5203"},
}

// TestNodeSharesNeverOverTheirRate (issue 37): three pods on the real node,
// shares of 45M, 130M and 730M of one parent, all saturated at once by one
// TCP flow each, ingress and then egress, CARVE_E2E_OVERRATE_RUNS runs in a
// row (1 unless set; make soak runs 20). No share's goodput may pass 0.966
// of its limit in any run: 0.956 is the limit met exactly at L2 (1448
// bytes of payload a 1514-byte frame), and past 1% over it the share has
// leaked. Goodput is the receiver's whole one-second intervals after 2 s
// omitted (iperf3's own summary counts omitted seconds in). The 45M and
// 130M shares must also reach 0.85 of their limit, so that a run in which
// nothing flowed cannot pass; the 730M share is what this machine's two
// cores leave it, and only its ceiling is judged.
func TestNodeSharesNeverOverTheirRate(t *testing.T) {
	runs := 1
	if v := os.Getenv("CARVE_E2E_OVERRATE_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CARVE_E2E_OVERRATE_RUNS=%q: want a count of runs, at least 1", v)
		}
		runs = n
	}
	cs := client(t)
	env := clusterEnv(t)
	quietHost(t)
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	ports := make([]string, len(overRateShares))
	for i, s := range overRateShares {
		ports[i] = s.port
	}
	trafficServer(t, overParent, "carve-e2o1", overServer, overIP, ports...)
	buildAgentImage(t, "carve:e2e")
	buildNetTestImage(t)
	installChart(t, env, stateDir, nicNodeConfig(overParent, "over", "10.86.0.0/24", overIP, ""))
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["over"],"interfaceName":"net1"}`
	for _, s := range overRateShares {
		sharePod{name: s.pod, parent: overParent, capacity: bothWays(s.limit), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
	}
	for _, s := range overRateShares {
		waitFor(t, "pod "+s.pod, 90*time.Second, podRunning(cs, testNS, s.pod))
	}

	var table strings.Builder
	table.WriteString("| run | direction | 45M | 130M | 730M |\n|---|---|---|---|---|\n")
	highest := map[string]float64{}
	for run := 1; run <= runs; run++ {
		for _, reverse := range []bool{true, false} {
			dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
			results := make([]chan iperfResult, len(overRateShares))
			for i, s := range overRateShares {
				results[i] = startIperfOmitting(s.pod, overIP, s.port, 2, 5, reverse)
			}
			row := []string{strconv.Itoa(run), dir}
			for i, s := range overRateShares {
				r := <-results[i]
				if r.err != nil {
					t.Errorf("run %d: iperf3 in %s (%s): %v", run, s.pod, dir, r.err)
					row = append(row, "–")
					continue
				}
				ratio := r.bps / rate(s.limit)
				row = append(row, fmt.Sprintf("%.3f", ratio))
				key := s.limit + " " + dir
				highest[key] = max(highest[key], ratio)
				if ratio > 0.966 {
					t.Errorf("run %d: the %s share's %s goodput is %.3f of its limit, over 0.966 (per second, Mbit/s: %v)", run, s.limit, dir, ratio, mbits(r.intervals))
				}
				if s.limit != "730M" && ratio < 0.85 {
					t.Errorf("run %d: the %s share's %s goodput is %.3f of its limit, under 0.85 (per second, Mbit/s: %v)", run, s.limit, dir, ratio, mbits(r.intervals))
				}
			}
			table.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
	}
	t.Logf("goodput/limit, three shares saturated at once, %d runs:\n%s", runs, table.String())
	for _, s := range overRateShares {
		t.Logf("the %s share's highest: ingress %.3f, egress %.3f", s.limit, highest[s.limit+" ingress"], highest[s.limit+" egress"])
	}
}

package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestMultiNodeRollout: helm upgrade of the agent on three nodes completes,
// from hostNetwork true to false and back (the DaemonSet's surge pod finds
// no host port taken: the hostNetwork chart declares none), while a share
// on every node carries traffic; no stretch of a share's frames on the wire
// (each node's port on the tenants' segment bridge, every 100 ms) carries
// more than 1.01 of its limit by more than its class's burst and one
// super-packet (shareBurstBound) while the agents are replaced: an agent
// that left the share unshaped for a moment would let out megabytes. That
// bound holds any second to 1.01 of the limit plus about 12 ms of it:
// after a TCP timeout's 200-300 ms of silence, a second here read 1.009 at
// L2, the token bucket's, so the second is logged, not judged alone. iperf3's own seconds are logged: its
// receiver counts in-order bytes as the application reads them, which a
// delayed read or a filled hole moves from one second to the next (one CI
// run read 1.029 in a second the wire cannot have carried).
func TestMultiNodeRollout(t *testing.T) {
	c := multiNodeCluster(t, 3)
	quietHost(t)
	cs := client(t)
	c.importImages(t)
	c.installChart(t, c.poolConfig())
	c.iperfServers(t, "5201", "5202", "5203")
	for i := 1; i <= 3; i++ {
		sharePod{name: fmt.Sprintf("mnroll%d", i), parent: c.env["CARVE_SEGMENT_PARENT"], capacity: bothWays("100M"), netCfg: mnNetCfg,
			image: "carve-net-test:e2e", mutate: c.onNode(i)}.start(t, cs)
	}
	for i := 1; i <= 3; i++ {
		waitFor(t, fmt.Sprintf("pod mnroll%d", i), 2*time.Minute, podRunning(cs, testNS, fmt.Sprintf("mnroll%d", i)))
	}
	kc := os.Getenv("CARVE_KUBECONFIG")
	server := c.env["CARVE_SEGMENT_SERVER_IP"]
	// The traffic runs 30 s (an upgrade took 7-13 s here) and must outlast
	// the upgrade, or its seconds would not cover all of it.
	const traffic = 30
	limit := rate("100M")
	// What the class may let out beyond its rate at once: its burst and
	// a super-packet (shareBurstBound: 149,962 bytes at 100M).
	burst := shareBurstBound(limit)
	for _, hostNetwork := range []string{"false", "true"} {
		res := make([]chan iperfResult, 3)
		wires := make([]*wireSampler, 3)
		trafficStart := time.Now()
		for i := range res {
			wires[i] = sampleWire(t, "", fmt.Sprintf("cvmn-s%d", i+1), limit)
			res[i] = startIperfTo(fmt.Sprintf("mnroll%d", i+1), server, fmt.Sprint(5201+i), traffic, false)
		}
		time.Sleep(3 * time.Second)
		start := time.Now()
		run(t, os.Getenv("CARVE_HELM"), "upgrade", "carve", chartDir(), "--kubeconfig", kc, "--namespace", chartNamespace,
			"--reuse-values", "--set", "hostNetwork="+hostNetwork, "--wait", "--timeout", "180s")
		t.Logf("helm upgrade to hostNetwork=%s on %d nodes: done in %.1f s", hostNetwork, c.nodes, time.Since(start).Seconds())
		if d := time.Since(trafficStart); d > (traffic-1)*time.Second {
			t.Errorf("the upgrade ended %.1f s after the traffic started, past its %d s: not every second of it was measured", d.Seconds(), traffic)
		}
		for i, ch := range res {
			r := <-ch
			st := wires[i].finish()
			if r.err != nil {
				t.Fatalf("iperf3 in mnroll%d: %v", i+1, r.err)
			}
			top := 0.0
			for _, bps := range r.intervals {
				top = max(top, bps/limit)
			}
			t.Logf("node %d during the upgrade: iperf3 goodput %.3f of the limit, highest second %.3f; wire, every 100 ms: %d samples (%d uncertain, left out), "+
				"beyond 1.01 of the limit at most %.0f bytes (the class's burst and a super-packet: %d), over a second or more at most %.3f, longest silence %v",
				i+1, r.bps/limit, top, st.samples, st.uncertain, st.overBurst, burst, st.maxSecond/limit, st.longestSilence)
			if st.overBurst > float64(burst) {
				t.Errorf("node %d: during the upgrade to hostNetwork=%s a stretch carried %.0f bytes beyond 1.01 of the share's limit, more than its class's burst and a super-packet, %d",
					i+1, hostNetwork, st.overBurst, burst)
			}

		}
	}
}

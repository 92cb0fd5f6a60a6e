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
// on every node carries traffic; no second of any share's goodput is over
// 1.01 of its limit while the agents are replaced.
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
	for _, hostNetwork := range []string{"false", "true"} {
		res := make([]chan iperfResult, 3)
		trafficStart := time.Now()
		for i := range res {
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
			if r.err != nil {
				t.Fatalf("iperf3 in mnroll%d: %v", i+1, r.err)
			}
			top := 0.0
			for _, bps := range r.intervals {
				top = max(top, bps/rate("100M"))
			}
			t.Logf("node %d during the upgrade: goodput %.3f of the limit, highest second %.3f", i+1, r.bps/rate("100M"), top)
			if top > 1.01 {
				t.Errorf("node %d: a second at %.3f of the share's limit during the upgrade to hostNetwork=%s, over 1.01", i+1, top, hostNetwork)
			}
		}
	}
}

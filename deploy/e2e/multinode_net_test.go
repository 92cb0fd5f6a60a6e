package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mnNetCfg asks for an address of the cluster-wide pool, in the pod as net1.
const mnNetCfg = `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["seg"],"interfaceName":"net1"}`

// TestMultiNodeShares: one agent a node, each node's seg0 shared; a pod on
// each of three nodes with a share of 100M, 200M and 300M, its address from
// the one pool all nodes hand out: the addresses differ, and all three
// shares, saturated at once, egress then ingress, are each held to their
// limit within 1% of L2 (TCP goodput 0.946-0.966 of the limit, 0.956 the
// limit met exactly over 1500-byte frames).
func TestMultiNodeShares(t *testing.T) {
	c := multiNodeCluster(t, 3)
	quietHost(t)
	cs := client(t)
	c.importImages(t)
	c.installChart(t, c.poolConfig())
	c.iperfServers(t, "5201", "5202", "5203")
	parent := c.env["CARVE_SEGMENT_PARENT"]
	limits := []string{"100M", "200M", "300M"}
	for i := 1; i <= 3; i++ {
		sharePod{name: fmt.Sprintf("mn%d", i), parent: parent, capacity: bothWays(limits[i-1]), netCfg: mnNetCfg,
			image: "carve-net-test:e2e", mutate: c.onNode(i)}.start(t, cs)
	}
	addrs := map[string]string{}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("mn%d", i)
		waitFor(t, "pod "+name, 120*time.Second, podRunning(cs, testNS, name))
		p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != c.name(i) {
			t.Errorf("pod %s on %s, want %s", name, p.Spec.NodeName, c.name(i))
		}
		out := podExec(t, testNS, name, "main", "ip", "-4", "-o", "addr", "show", "net1")
		f := strings.Fields(out)
		if len(f) < 4 {
			t.Fatalf("pod %s: net1 has no IPv4 address:\n%s", name, out)
		}
		if other, dup := addrs[f[3]]; dup {
			t.Errorf("pods %s and %s on different nodes both have %s", other, name, f[3])
		}
		addrs[f[3]] = name
	}
	t.Logf("addresses: %v", addrs)
	server := c.env["CARVE_SEGMENT_SERVER_IP"]
	for _, reverse := range []bool{false, true} {
		dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
		res := make([]chan iperfResult, 3)
		for i := range res {
			res[i] = startIperfTo(fmt.Sprintf("mn%d", i+1), server, fmt.Sprint(5201+i), 5, reverse)
		}
		for i, ch := range res {
			r := <-ch
			if r.err != nil {
				t.Fatalf("iperf3 in mn%d: %v", i+1, r.err)
			}
			ratio := r.bps / rate(limits[i])
			t.Logf("node %d %s: share %s, goodput %.1f Mbit/s, ratio %.3f", i+1, dir, limits[i], r.bps/1e6, ratio)
			if ratio < 0.946 || ratio > 0.966 {
				t.Errorf("node %d %s: goodput ratio %.3f, want 0.946-0.966 (the limit within 1%% of L2)", i+1, dir, ratio)
			}
		}
	}
}

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMultiNodeCrossNodeAttacks: a tenant on node 1 attacks a tenant on
// node 2 over the shared segment with raw frames (CAP_NET_RAW, the
// runtime's default): the victim's MAC or IP as its source, ARP replies
// claiming the victim's IP, junk broadcast from a MAC of no share, and a
// flood from its own identity. None of the forged frames reaches the
// segment (the server's end and the victim's node receive none of them);
// the segment bridge still sends the victim's MAC to the victim's node, the
// server's ARP entry for the victim is not poisoned and it still reaches
// the victim; the attacker's own flood is held to its share.
func TestMultiNodeCrossNodeAttacks(t *testing.T) {
	c := multiNodeCluster(t, 2)
	cs := client(t)
	c.importImages(t)
	c.importEscapeImage(t)
	c.installChart(t, c.poolConfig())
	parent := c.env["CARVE_SEGMENT_PARENT"]
	sharePod{name: "atk", parent: parent, capacity: bothWays("20M"), netCfg: mnNetCfg, image: "carve-net-escape:mn", mutate: c.onNode(1)}.start(t, cs)
	sharePod{name: "vic", parent: parent, capacity: bothWays("20M"), netCfg: mnNetCfg, image: "carve-net-test:e2e", mutate: c.onNode(2)}.start(t, cs)
	ips, macs := map[string]string{}, map[string]string{}
	for _, name := range []string{"atk", "vic"} {
		waitFor(t, "pod "+name, 2*time.Minute, podRunning(cs, testNS, name))
		envs := podExec(t, testNS, name, "main", "env")
		ips[name] = strings.Split(envValue(envs, "CARVE_NET_ADDRESSES"), "/")[0]
		macs[name] = shareMAC(t, name)
	}
	srvNS, srvIP := c.env["CARVE_SEGMENT_SERVER_NS"], c.env["CARVE_SEGMENT_SERVER_IP"]
	srvMAC := strings.Fields(strings.SplitN(run(t, "ip", "-n", srvNS, "-o", "link", "show", "seg0"), "link/ether ", 2)[1])[0]
	// The server learns the victim's MAC the honest way first.
	if !serverReaches(srvNS, ips["vic"]) {
		t.Fatalf("the server does not reach the victim %s before any attack", ips["vic"])
	}
	rx := func(what string) uint64 {
		var out string
		if what == "server" {
			out = run(t, "ip", "netns", "exec", srvNS, "cat", "/sys/class/net/seg0/statistics/rx_bytes")
		} else {
			out = c.exec(t, 2, "cat", "/sys/class/net/seg0/statistics/rx_bytes")
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
		return n
	}
	for _, tc := range []struct {
		what, dstMAC string
		args         []string
	}{
		{"the victim's MAC", srvMAC, []string{"-src-mac", macs["vic"], "-src-ip", ips["atk"]}},
		{"the victim's IP", srvMAC, []string{"-src-mac", macs["atk"], "-src-ip", ips["vic"]}},
		{"ARP replies claiming the victim's IP", srvMAC, []string{"-src-mac", macs["atk"], "-src-ip", ips["atk"], "-arp-claim", ips["vic"]}},
		{"junk broadcast from a MAC of no share", "ff:ff:ff:ff:ff:ff", []string{"-src-mac", "02:ba:d0:00:00:02", "-src-ip", ips["atk"]}},
	} {
		s0, v0 := rx("server"), rx("victim")
		out := podExec(t, testNS, "atk", "main", append([]string{"rawflood", "-if", "net1", "-dst-mac", tc.dstMAC, "-dst-ip", srvIP, "-seconds", "2"}, tc.args...)...)
		time.Sleep(200 * time.Millisecond)
		s, v := rx("server")-s0, rx("victim")-v0
		// rawflood counts the frames its pod's kernel took: the pod
		// guard on its interface refuses forged ones (bpf/podguard.go).
		t.Logf("frames with %s: %s taken by the pod's kernel; the server's end received %d bytes, the victim's node %d", tc.what, strings.TrimSpace(out), s, v)
		// A few of the pods' own ARP and ND frames at most.
		if s > 20_000 || v > 20_000 {
			t.Errorf("frames with %s reached the segment: %d bytes at the server, %d at the victim's node", tc.what, s, v)
		}
	}
	if fdb := run(t, "bridge", "fdb", "show", "br", c.env["CARVE_SEGMENT_BRIDGE"]); !strings.Contains(fdb, macs["vic"]+" dev cvmn-s2 ") {
		t.Errorf("the segment no longer sends the victim's MAC %s to its node's port cvmn-s2:\n%s", macs["vic"], fdb)
	}
	if neigh := run(t, "ip", "-n", srvNS, "neigh", "show", ips["vic"]); strings.Contains(neigh, macs["atk"]) {
		t.Errorf("the server's ARP entry for the victim was poisoned: %s", neigh)
	}
	if !serverReaches(srvNS, ips["vic"]) {
		t.Errorf("the server no longer reaches the victim %s after the attacks", ips["vic"])
	}
	// The attacker's flood from its own identity: held to its 20M share.
	s0 := rx("server")
	start := time.Now()
	podExec(t, testNS, "atk", "main", "rawflood", "-if", "net1", "-src-mac", macs["atk"], "-src-ip", ips["atk"], "-dst-mac", srvMAC, "-dst-ip", srvIP, "-seconds", "4")
	got := float64(rx("server")-s0) * 8 / time.Since(start).Seconds()
	t.Logf("the attacker's own flood reached the server at %.1f Mbit/s (share 20M)", got/1e6)
	if got > 1.02*rate("20M") {
		t.Errorf("the attacker's own flood reached the server at %.1f Mbit/s, over its 20M share", got/1e6)
	}
	// And the raw frames of the attacks would have reached the segment
	// had they been the pod's own: rawflood works from this pod.
	if got < 0.5*rate("20M") {
		t.Errorf("the attacker's own flood reached the server at %.1f Mbit/s: rawflood sends nothing from the pod, and the attacks above prove nothing", got/1e6)
	}
}

func serverReaches(ns, addr string) bool {
	return exec.Command("ip", "netns", "exec", ns, "busybox", "ping", "-c", "3", "-W", "1", addr).Run() == nil
}

// importEscapeImage builds the pods' image with rawflood (a static Go
// binary, deploy/e2e/rawflood) as carve-net-escape:mn, into every node.
func (c *mnCluster) importEscapeImage(t testing.TB) {
	t.Helper()
	root := repoRoot()
	bin := filepath.Join(t.TempDir(), "rawflood")
	cmd := exec.Command("go", "build", "-o", bin, "./deploy/e2e/rawflood")
	cmd.Dir, cmd.Env = root, append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build rawflood: %v\n%s", err, out)
	}
	args := []string{"--name", "carve-net-escape:mn", "--file", "/bin/busybox:/bin/busybox", "--file", bin + ":/bin/rawflood",
		"--out", filepath.Join(t.TempDir(), "net-escape.tar")}
	for _, applet := range []string{"sh", "ip", "env", "sleep", "cat"} {
		args = append(args, "--symlink", "/bin/"+applet+"=busybox")
	}
	archive := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), args...)))
	for i := 1; i <= c.nodes; i++ {
		cmd := exec.Command(filepath.Join(root, "deploy/images/import.sh"), archive)
		cmd.Env = append(os.Environ(), "CARVE_CLUSTER_DIR="+c.env["CARVE_CLUSTER_DIR"],
			"CARVE_CONTAINERD_ADDRESS="+c.env[fmt.Sprintf("CARVE_NODE_%d_CONTAINERD_ADDRESS", i)])
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("import into node %d: %v\n%s", i, err, out)
		}
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/bpf"
)

const (
	netParent = "carve-e2n0"
	netServer = "carve-e2n-srv" // the traffic server's namespace
	serverIP  = "10.79.0.1"
)

// TestNodeNetworkShares: two pods, each with a bandwidth share of one parent
// NIC (a veth whose peer is in a namespace running iperf3 servers), are
// scheduled by the real scheduler and prepared by the real kubelet;
// containerd runs carve's hook, the share's interface appears in each pod
// with its address, and traffic measured from inside the pods holds to each
// share, also while the agent restarts. Deleting a pod removes its classes
// and classifier entries.
func TestNodeNetworkShares(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	quietHost(t)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")

	trafficServer(t, netParent, "carve-e2n1", netServer, serverIP, "5201", "5202")

	buildAgentImage(t, "carve:e2e")
	buildNetTestImage(t)
	installChart(t, env, stateDir, nicNodeConfig(netParent, "e2e", "10.79.0.0/24", serverIP, ""))

	limits := map[string]string{"pa": "100M", "pb": "300M"}
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["e2e"],"interfaceName":"net1"}`
	for name, limit := range limits {
		sharePod{name: name, parent: netParent, capacity: bothWays(limit), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
	}
	macs := map[string]string{}
	for name := range limits {
		waitFor(t, "pod "+name, 90*time.Second, podRunning(cs, testNS, name))
		addr := podExec(t, testNS, name, "main", "ip", "-4", "addr", "show", "net1")
		if !strings.Contains(addr, "10.79.0.") {
			t.Errorf("pod %s: net1 has no pool address:\n%s", name, addr)
		}
		macs[name] = shareMAC(t, name)
		if link := podExec(t, testNS, name, "main", "ip", "link", "show", "net1"); !strings.Contains(link, "link/ether "+macs[name]+" ") {
			t.Errorf("pod %s: net1 does not have the share's MAC %s:\n%s", name, macs[name], link)
		}
		// The status is written after the kubelet's answer, off the
		// pod's path, and lands shortly after.
		var claim *resourceapi.ResourceClaim
		deadline := time.Now().Add(10 * time.Second)
		for {
			var err error
			if claim, err = cs.ResourceV1().ResourceClaims(testNS).Get(ctx, name, metav1.GetOptions{}); err != nil {
				t.Fatal(err)
			}
			if len(claim.Status.Devices) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(claim.Status.Devices) != 1 || claim.Status.Devices[0].NetworkData == nil || claim.Status.Devices[0].NetworkData.InterfaceName != "net1" ||
			len(claim.Status.Devices[0].NetworkData.IPs) != 1 || claim.Status.Devices[0].ShareID == nil ||
			claim.Status.Devices[0].NetworkData.HardwareAddress != macs[name] {
			t.Errorf("claim %s status.devices = %+v, want net1 with its address, MAC %s and share\nagent logs:\n%s", name, claim.Status.Devices, macs[name], agentLogs())
		}
	}

	// Both pods at once, each direction: goodput from inside the pods.
	for _, reverse := range []bool{false, true} {
		dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
		results := map[string]chan iperfResult{}
		for name, port := range map[string]string{"pa": "5201", "pb": "5202"} {
			results[name] = startIperf(name, port, 4, reverse)
		}
		for name, limit := range limits {
			r := <-results[name]
			if r.err != nil {
				t.Fatalf("iperf3 in %s: %v", name, r.err)
			}
			ratio := r.bps / rate(limit)
			t.Logf("%s %s: allocated %s, measured %.1f Mbit/s goodput (ratio %.3f)", name, dir, limit, r.bps/1e6, ratio)
			if ratio < 0.85 || ratio > 1.02 {
				t.Errorf("%s %s: goodput ratio %.3f, want about 0.95 (a limit met to within 1%%)", name, dir, ratio)
			}
		}
	}

	// Restart the agent mid-traffic: the limit holds throughout.
	long := startIperf("pa", "5201", 8, false)
	time.Sleep(2 * time.Second)
	restartAgent(t, cs)
	r := <-long
	if r.err != nil {
		t.Fatalf("iperf3 across the agent restart: %v", r.err)
	}
	for i, bps := range r.intervals {
		if bps > 1.1*rate("100M") {
			t.Errorf("interval %d during the agent restart: %.1f Mbit/s, over the 100M share", i, bps/1e6)
		}
	}
	t.Logf("pa egress across the agent restart: %.1f Mbit/s (intervals %v)", r.bps/1e6, mbits(r.intervals))

	// Deleting a pod removes its share's classifier entries, and its
	// classes hold it no longer (parked for the next share).
	shaper, err := bpf.OpenShaper(e2ePins)
	if err != nil {
		t.Fatal(err)
	}
	defer shaper.Close()
	// Egress classes are on the parent's egress shaper.
	egressShaper := "cveg" + ifindex(t, netParent)
	classesBefore := countClasses(egressShaper)
	_ = cs.CoreV1().Pods(testNS).Delete(ctx, "pa", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	waitFor(t, "pa's share removed", 60*time.Second, func() (bool, error) {
		shares, err := shaper.Shares()
		if err != nil {
			return false, err
		}
		_, egress := shares[bpf.Key{MAC: macs["pa"], Dir: bpf.Egress}]
		_, ingress := shares[bpf.Key{MAC: macs["pa"], Dir: bpf.Ingress}]
		return !egress && !ingress && countClasses(egressShaper) == classesBefore-1, fmt.Errorf("entries %v, classes %d", shares, countClasses(egressShaper))
	})
	if _, ok := mustShares(t, shaper)[bpf.Key{MAC: macs["pb"], Dir: bpf.Egress}]; !ok {
		t.Errorf("pb's share went with pa's")
	}
	_ = cs.CoreV1().Pods(testNS).Delete(ctx, "pb", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	waitFor(t, "every share removed, and the parent's egress shaper and IFB with them", 60*time.Second, func() (bool, error) {
		out, _ := exec.Command("tc", "qdisc", "show", "dev", netParent).Output()
		_, ifbErr := exec.Command("ip", "link", "show", "cvifb"+ifindex(t, netParent)).Output()
		_, shaperErr := exec.Command("ip", "link", "show", egressShaper).Output()
		shares := mustShares(t, shaper)
		_, bLeft := shares[bpf.Key{MAC: macs["pb"], Dir: bpf.Egress}]
		ifbClasses, _ := exec.Command("tc", "class", "show", "dev", "cvifb"+ifindex(t, netParent)).Output()
		return !bLeft && !strings.Contains(string(out), "htb") && ifbErr != nil && shaperErr != nil,
			fmt.Errorf("qdiscs %s, shares %v, IFB classes %s, egress shaper left: %v\nagent:\n%s", out, shares, ifbClasses, shaperErr == nil, agentLogs())
	})
}

// shareMAC is the MAC the share's CDI edits gave pod (CARVE_NET_MAC), in
// the canonical form; the test fails where it is missing or not a MAC.
func shareMAC(t testing.TB, pod string) string {
	t.Helper()
	envs := podExec(t, testNS, pod, "main", "env")
	mac, err := net.ParseMAC(envValue(envs, "CARVE_NET_MAC"))
	if err != nil || len(mac) != 6 {
		t.Fatalf("pod %s: CARVE_NET_MAC is not the share's MAC (%v):\n%s", pod, err, envs)
	}
	return mac.String()
}

// agentLogs is the current agent pod's log, for failure messages.
func agentLogs() string {
	kc := os.Getenv("CARVE_KUBECONFIG")
	kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
	out, _ := exec.Command(kubectl, "--kubeconfig", kc, "logs", "-n", chartNamespace, "-l", "app.kubernetes.io/name=carve", "--tail=40").CombinedOutput()
	return string(out)
}

func mustShares(t testing.TB, s *bpf.Shaper) map[bpf.Key]uint32 {
	m, err := s.Shares()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ifindex(t testing.TB, dev string) string {
	b, err := os.ReadFile("/sys/class/net/" + dev + "/ifindex")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// countClasses counts the shares' classes on dev: HTB classes under its link
// class (or its root, where an older carve made it), not the flow children under a share's class (netdev/flows.go), nor the
// parked ones (netdev/park.go), whose ceil burst is past their burst.
func countClasses(dev string) int {
	out, _ := exec.Command("tc", "class", "show", "dev", dev).Output()
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		// Share classes hang from the link class 1:1 (or, on a
		// device an older carve made, from the HTB itself); 1:1 and
		// the unshared class 1:2 are not shares'.
		f := strings.Fields(l)
		if !strings.HasPrefix(l, "class htb") || len(f) < 4 || f[2] == "1:1" || f[2] == "1:2" ||
			(!strings.Contains(l, " root ") && !strings.Contains(l, " parent 1:1 ")) {
			continue
		}
		var burst, cburst string
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "burst":
				burst = f[i+1]
			case "cburst":
				cburst = f[i+1]
			}
		}
		if burst == cburst {
			n++
		}
	}
	return n
}

func rate(s string) float64 {
	q := resource.MustParse(s)
	return float64(q.Value())
}

func mbits(bps []float64) []string {
	out := make([]string, len(bps))
	for i, b := range bps {
		out[i] = fmt.Sprintf("%.0f", b/1e6)
	}
	return out
}

type iperfResult struct {
	bps       float64
	intervals []float64
	err       error
}

// startIperf runs iperf3 inside a pod against the server namespace, in the
// background; reverse measures the pod's ingress.
func startIperf(pod, port string, seconds int, reverse bool) chan iperfResult {
	return startIperfTo(pod, serverIP, port, seconds, reverse)
}

// startIperfTo is startIperf against the iperf3 server at server.
func startIperfTo(pod, server, port string, seconds int, reverse bool) chan iperfResult {
	return startIperfOmitting(pod, server, port, 1, seconds, reverse)
}

// startIperfOmitting is startIperfTo with omit seconds before the measured
// ones: many clients started at once take seconds to start (kubectl exec
// each), and the first ones' windows would open in that storm.
func startIperfOmitting(pod, server, port string, omit, seconds int, reverse bool) chan iperfResult {
	kubectl := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "bin", "kubectl")
	args := []string{"--kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "exec", "-n", testNS, pod, "-c", "main", "--",
		"iperf3", "-c", server, "-p", port, "-t", fmt.Sprint(omit + seconds), "-O", fmt.Sprint(omit), "-J", "--get-server-output"}
	if reverse {
		args = append(args, "-R")
	}
	ch := make(chan iperfResult, 1)
	go func() {
		out, err := exec.Command(kubectl, args...).Output()
		if err != nil {
			ch <- iperfResult{err: fmt.Errorf("%v: %s", err, out)}
			return
		}
		var rep iperfReport
		if err := json.Unmarshal(out, &rep); err != nil {
			ch <- iperfResult{err: fmt.Errorf("iperf3 JSON: %v", err)}
			return
		}
		recv := rep.receiver()
		if recv == nil {
			ch <- iperfResult{err: fmt.Errorf("iperf3 reported no receiver's intervals (is the server run with -J?):\n%s", out)}
			return
		}
		bps, _ := recv.rates()
		r := iperfResult{bps: bps}
		for _, iv := range recv.Intervals {
			if !iv.Sum.Omitted && iv.Sum.Seconds >= 0.9 && iv.Sum.Seconds <= 1.1 {
				r.intervals = append(r.intervals, iv.Sum.BitsPerSecond)
			}
		}
		ch <- r
	}()
	return ch
}

// buildNetTestImage builds the pods' image: busybox and iperf3 (with its
// libraries) from this machine.
func buildNetTestImage(t testing.TB) {
	t.Helper()
	root := repoRoot()
	args := []string{"--name", "carve-net-test:e2e", "--file", "/bin/busybox:/bin/busybox", "--file", "/usr/bin/iperf3:/usr/bin/iperf3"}
	for _, applet := range []string{"sh", "ip", "env", "sleep", "cat", "ls", "ping"} {
		args = append(args, "--symlink", "/bin/"+applet+"=busybox")
	}
	importOnce(t, strings.Join(args, "\x00"), func() {
		args := append(args, "--out", filepath.Join(t.TempDir(), "net-test.tar"))
		archive := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), args...)))
		run(t, filepath.Join(root, "deploy/images/import.sh"), archive)
	})
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

const (
	borrowParent = "carve-e2b0"
	borrowServer = "carve-e2b-srv"
	borrowIP     = "10.87.0.1"
	borrowClass  = "nic-borrow-e2e.carve.dev"
)

// TestNodeBorrowingShares (issue 42) on the real node: a NIC whose link rate
// the node config fixes at 1G each way, and a DeviceClass whose claims may
// borrow up to the link (maxCeiling: link). Two pods, floors 100M and 300M,
// each saturating its share with one TCP flow (iperf3), ingress then egress:
// both at once, each gets at least its floor and the two fill the link, the
// excess over the floors splitting by them (1:3 within 10%); then each
// alone reaches the link. Then, egress: the 300M one starting beside the
// 100M one alone on the link is back at its floor within 200 ms of its
// first frames (10 ms samples of the classifier's bytes); and with the 100M
// one flooding UDP, the 300M one's TCP still gets at least its floor. A
// ping from the 300M one saturated alone keeps p99 within 5 ms, each way.
// The shares' rates at L2 are what their classes let out (classMeter); the
// flood's neighbour's, the receiver's goodput over 0.956 (1448 bytes of
// payload a 1514-byte frame).
func TestNodeBorrowingShares(t *testing.T) {
	cs, _ := borrowNode(t, "")
	quietHost(t)
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["borrow"],"interfaceName":"net1"}`
	pods := []struct{ name, floor, port string }{{"bw100", "100M", "5201"}, {"bw300", "300M", "5202"}}
	for _, p := range pods {
		sharePod{name: p.name, parent: borrowParent, class: borrowClass, capacity: bothWays(p.floor), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
	}
	for _, p := range pods {
		waitFor(t, "pod "+p.name, 90*time.Second, podRunning(cs, testNS, p.name))
	}
	const link, met = 1e9, 0.956
	var report strings.Builder
	names := []string{pods[0].name, pods[1].name}
	for _, reverse := range []bool{true, false} {
		dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
		meter := shareClassMeter(t, names, map[bool]bpf.Direction{false: bpf.Egress, true: bpf.Ingress}[reverse])
		results := make([]chan iperfResult, len(pods))
		for i, p := range pods {
			results[i] = startIperfOmitting(p.name, borrowIP, p.port, 0, 7, reverse)
		}
		l2 := meter.rates(t, 2500*time.Millisecond, 4*time.Second)
		goodput := make([]float64, len(pods))
		for i, p := range pods {
			r := <-results[i]
			if r.err != nil {
				t.Fatalf("iperf3 in %s (%s): %v", p.name, dir, r.err)
			}
			goodput[i] = r.bps / met
		}
		low, high := l2[0], l2[1]
		split := (low - 100e6) / (high - 300e6)
		fmt.Fprintf(&report, "%s, both: %.1f and %.1f Mbit/s at L2, %.3f of the link, excess split %.3f (iperf3's in-order goodput over %.3f: %.1f and %.1f)\n",
			dir, low/1e6, high/1e6, (low+high)/link, split, met, goodput[0]/1e6, goodput[1]/1e6)
		if low < 0.99*100e6 || high < 0.99*300e6 {
			t.Errorf("%s: %.1f and %.1f Mbit/s at L2, want each at least its floor (100M, 300M) within 1%%", dir, low/1e6, high/1e6)
		}
		if sum := (low + high) / link; sum < 0.95 || sum > 1.01 {
			t.Errorf("%s: the two together %.3f of the link at L2, want 0.95 to 1.01", dir, sum)
		}
		if split < 0.300 || split > 0.367 {
			t.Errorf("%s: the excess split %.3f, want the floors' 0.333 within 10%% (0.300–0.367)", dir, split)
		}
		for i, p := range pods {
			res := startIperfOmitting(p.name, borrowIP, p.port, 0, 5, reverse)
			alone := meter.rates(t, 1500*time.Millisecond, 3*time.Second)[i] / link
			if r := <-res; r.err != nil {
				t.Fatalf("iperf3 in %s alone (%s): %v", p.name, dir, r.err)
			}
			fmt.Fprintf(&report, "%s, %s alone: %.3f of its ceiling (the link) at L2\n", dir, p.name, alone)
			if alone < 0.99 || alone > 1.01 {
				t.Errorf("%s, %s alone: %.3f of its ceiling at L2, want within 1%%", dir, p.name, alone)
			}
		}
	}
	// A ping from a borrowing share saturated alone on the link (past its
	// floor, so its flow children borrow too) keeps p99 within 5 ms: 200
	// probes 20 ms apart, each way. The p99 of 200 is the third highest
	// (nearest rank): of 100 probes it would be the highest, one probe's
	// delay by the 2-core host's scheduler, not the share's queue (a CI
	// run read p50 109µs and one probe of 100 at 6.4 ms).
	for _, reverse := range []bool{false, true} {
		dir := map[bool]string{false: "egress", true: "ingress"}[reverse]
		bulk := startIperfOmitting(pods[1].name, borrowIP, pods[1].port, 0, 7, reverse)
		time.Sleep(1500 * time.Millisecond)
		rtts := podPing(t, pods[1].name, borrowIP, 200)
		if r := <-bulk; r.err != nil {
			t.Fatalf("iperf3 in %s under the ping (%s): %v", pods[1].name, dir, r.err)
		}
		p50, p99 := percentile(rtts, 0.50), percentile(rtts, 0.99)
		fmt.Fprintf(&report, "%s, a ping from %s saturated alone: p50 %v, p99 %v, highest %v\n", dir, pods[1].name, p50, p99, rtts[len(rtts)-1])
		if p99 > 5*time.Millisecond {
			t.Errorf("%s: a ping from %s saturated alone on the link: p99 %v, want at most 5 ms", dir, pods[1].name, p99)
		}
	}

	// An idle share that starts sending beside a borrower of the link is
	// back at its floor within 200 ms: its classifier bytes every 10 ms,
	// from its first frames.
	back, timeline := returnToFloor(t, pods[0].name, pods[1].name, pods[0].port, pods[1].port, 300e6)
	fmt.Fprintf(&report, "egress, %s starting beside %s alone on the link: at its floor %v after its first frames\n", pods[1].name, pods[0].name, back.Round(time.Millisecond))
	if back < 0 || back > 200*time.Millisecond {
		t.Errorf("egress: %s back at its floor after %v, want within 200 ms; its rate at L2 every 10 ms:\n%s", pods[1].name, back, timeline)
	}

	// A borrower flooding UDP (iperf3 offering 2G) leaves its neighbour's
	// TCP its floor: egress.
	kubectl := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "bin", "kubectl")
	flood := exec.Command(kubectl, "--kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "exec", "-n", testNS, pods[0].name, "-c", "main", "--",
		"iperf3", "-c", borrowIP, "-p", pods[0].port, "-u", "-b", "2G", "-t", "7")
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	r := <-startIperfOmitting(pods[1].name, borrowIP, pods[1].port, 1, 3, false)
	_ = flood.Wait()
	if r.err != nil {
		t.Fatalf("iperf3 in %s beside the flood: %v", pods[1].name, r.err)
	}
	beside := r.bps / met / 300e6
	fmt.Fprintf(&report, "egress, %s's TCP beside %s flooding UDP: %.3f of its floor at L2\n", pods[1].name, pods[0].name, beside)
	if beside < 0.99 {
		t.Errorf("egress, %s's TCP beside a UDP flood: %.3f of its floor at L2, want at least 0.99", pods[1].name, beside)
	}
	t.Logf("borrowing shares on the real node, floors 100M and 300M, link 1G:\n%s", report.String())
}

// classMeter reads the bytes each pod's share class has let out in one
// direction, as HTB counts them at L2 (its flow children's included): the
// rates of the borrowing test are judged by what the shaper gave each share.
// iperf3's receiver counts in-order bytes as its application reads them,
// which moves out-of-order data held at a window's start into the window:
// one run read the two shares at 1.019 of the link that way.
type classMeter struct{ read func() ([]uint64, error) }

func shareClassMeter(t *testing.T, pods []string, dir bpf.Direction) classMeter {
	t.Helper()
	shaper, err := bpf.OpenShaper(e2ePins)
	if err != nil {
		t.Fatal(err)
	}
	defer shaper.Close()
	classes := mustShares(t, shaper)
	handles := make([]uint32, len(pods))
	for i, pod := range pods {
		classid, ok := classes[bpf.Key{MAC: shareMAC(t, pod), Dir: dir}]
		if !ok {
			t.Fatalf("%s: no class for direction %v in the classifier", pod, dir)
		}
		handles[i] = classid
	}
	parent, err := netlink.LinkByName(borrowParent)
	if err != nil {
		t.Fatal(err)
	}
	name := netdev.EgressShaperName(parent.Attrs().Index)
	if dir == bpf.Ingress {
		name = netdev.IFBName(parent.Attrs().Index)
	}
	dev, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return classMeter{read: nettest.ClassBytes(&netlink.Handle{}, dev, handles)}
}

// rates waits settle (the flows' slow start), then returns each share's
// bits/s at L2 over the next window, timed between the two reads.
func (m classMeter) rates(t *testing.T, settle, window time.Duration) []float64 {
	t.Helper()
	time.Sleep(settle)
	before, err := m.read()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(window)
	after, err := m.read()
	if err != nil {
		t.Fatal(err)
	}
	dt := time.Since(start).Seconds()
	out := make([]float64, len(before))
	for i := range before {
		out[i] = float64(after[i]-before[i]) * 8 / dt
	}
	return out
}

// returnToFloor has pod borrower alone saturate its share's egress (TCP, 4
// s), and after 1.5 s pod returner start its own: it samples the
// returner's egress bytes in the classifier every 10 ms and returns how long
// after its first frames a 10 ms window first carried floor bits/s within 1%
// at L2 (-1: never), and the timeline.
func returnToFloor(t *testing.T, borrower, returner, borrowerPort, returnerPort string, floor float64) (time.Duration, string) {
	t.Helper()
	shaper, err := bpf.OpenShaper(e2ePins)
	if err != nil {
		t.Fatal(err)
	}
	defer shaper.Close()
	key := bpf.Key{MAC: shareMAC(t, returner), Dir: bpf.Egress}
	long := startIperfOmitting(borrower, borrowIP, borrowerPort, 0, 4, false)
	time.Sleep(1500 * time.Millisecond)
	type sample struct {
		at    time.Time
		bytes uint64
	}
	var samples []sample
	short := startIperfOmitting(returner, borrowIP, returnerPort, 0, 2, false)
	for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(10 * time.Millisecond) {
		st, err := shaper.Stats()
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, sample{time.Now(), st[key].Bytes})
	}
	for _, ch := range []chan iperfResult{short, long} {
		if r := <-ch; r.err != nil {
			t.Fatalf("iperf3: %v", r.err)
		}
	}
	var timeline strings.Builder
	var first time.Time
	back := time.Duration(-1)
	for i := 1; i < len(samples); i++ {
		dt := samples[i].at.Sub(samples[i-1].at)
		bytes := samples[i].bytes - samples[i-1].bytes
		if first.IsZero() {
			if bytes == 0 {
				continue
			}
			first = samples[i-1].at
		}
		rate := float64(bytes) * 8 / dt.Seconds() / 0.956
		fmt.Fprintf(&timeline, "%4d ms %6.1f Mbit/s\n", samples[i].at.Sub(first).Milliseconds(), rate/1e6)
		if back < 0 && dt >= 5*time.Millisecond && rate >= 0.99*floor {
			back = samples[i].at.Sub(first)
		}
	}
	return back, timeline.String()
}

// borrowNode installs the chart on the real node for a borrowing test: a
// NIC of 1G each way (a veth whose peer, in its own namespace, runs iperf3
// servers on 5201 and 5202) with the pool "borrow", and the DeviceClass
// borrowClass, whose claims may borrow up to the link; extra is more of the
// node config's netdev (nicNodeConfig).
func borrowNode(t *testing.T, extra string) (kubernetes.Interface, map[string]string) {
	t.Helper()
	cs := client(t)
	env := clusterEnv(t)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")
	trafficServer(t, borrowParent, "carve-e2b1", borrowServer, borrowIP, "5201", "5202")
	buildAgentImage(t, "carve:e2e")
	buildNetTestImage(t)
	installChart(t, env, stateDir, nicNodeConfigAt(borrowParent, "    egress: 1G\n    ingress: 1G\n", "borrow", "10.87.0.0/24", borrowIP, extra))
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: borrowClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "carve.dev" && device.attributes["carve.dev"].kind == "nic"`}}},
		Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "carve.dev", Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","allowedPools":["borrow"],"maxCeiling":"link"}`)}}}}},
	}}
	_ = cs.ResourceV1().DeviceClasses().Delete(ctx, borrowClass, metav1.DeleteOptions{})
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), borrowClass, metav1.DeleteOptions{})
	})
	return cs, env
}

// TestNodeBorrowingSharesOnAndOff (issue 42; make soak,
// CARVE_E2E_BORROW_ONOFF=1) is netdev's TestBorrowingSharesOnAndOff on the
// real node: 20 pods, floors of 10M to 50M and ceilings of 100M to 1G,
// switch one TCP flow each (from the pod's namespace to the server's) on
// and off at random for 60 s on a 1G NIC. In every whole second a pod sends
// throughout, its class sends at least its floor and at most its ceiling,
// within 1% at L2 as HTB counts it; in every second the sending pods fill
// the link, Jain's index over excess/floor is at least 0.95. Egress.
func TestNodeBorrowingSharesOnAndOff(t *testing.T) {
	if os.Getenv("CARVE_E2E_BORROW_ONOFF") != "1" {
		t.Skip("set CARVE_E2E_BORROW_ONOFF=1 to run (make soak)")
	}
	cs, env := borrowNode(t, "")
	quietHost(t)
	floors := []string{"10M", "20M", "30M", "50M"}
	ceilings := []string{"100M", "200M", "500M", "1G"}
	type member struct{ name, floor, ceil string }
	var members []member
	for i := range 20 {
		m := member{name: fmt.Sprintf("onoff%02d", i), floor: floors[i%4], ceil: ceilings[(i/4)%4]}
		netCfg := fmt.Sprintf(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["borrow"],"interfaceName":"net1","egressCeiling":%q}`, m.ceil)
		sharePod{name: m.name, parent: borrowParent, class: borrowClass, capacity: bothWays(m.floor), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
		members = append(members, m)
	}
	server, err := netns.GetFromName(borrowServer)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	shaper, err := bpf.OpenShaper(e2ePins)
	if err != nil {
		t.Fatal(err)
	}
	defer shaper.Close()
	var shares []nettest.OnOffShare
	handles := make([]uint32, len(members))
	for i, m := range members {
		waitFor(t, "pod "+m.name, 120*time.Second, podRunning(cs, testNS, m.name))
		p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), m.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := podNetns(t, env, string(p.UID))
		shares = append(shares, nettest.OnOffShare{Flow: nettest.Flow{From: pod, To: server, ToAddr: fmt.Sprintf("%s:%d", borrowIP, 5400+i)},
			Floor: rate(m.floor), Ceil: rate(m.ceil)})
		classid, ok := mustShares(t, shaper)[bpf.Key{MAC: shareMAC(t, m.name), Dir: bpf.Egress}]
		if !ok {
			t.Fatalf("%s: no egress class in the classifier", m.name)
		}
		handles[i] = classid
	}
	shaperDev, err := netlink.LinkByName("cveg" + ifindex(t, borrowParent))
	if err != nil {
		t.Fatal(err)
	}
	res, err := nettest.RunOnOff(shares, 60*time.Second, 1e9, nettest.ClassBytes(&netlink.Handle{}, shaperDev, handles))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d seconds with pods sending; %d floor misses, %d ceiling overruns; Jain's index over excess/floor in %d saturated seconds: %v",
		res.Seconds, len(res.Under), len(res.Over), len(res.Jains), res.Jains)
	if len(res.Under) > 0 {
		t.Errorf("floors missed in whole seconds of sending:\n%s", strings.Join(res.Under, "\n"))
	}
	if len(res.Over) > 0 {
		t.Errorf("ceilings overrun:\n%s", strings.Join(res.Over, "\n"))
	}
	if len(res.Jains) > 0 && res.Jains[0] < 0.95 {
		t.Errorf("Jain's index over excess/floor: %.3f in the worst saturated second, want at least 0.95 in every one", res.Jains[0])
	}
}

// podNetns is the network namespace of the pod of uid, from its sandbox's
// process (the node's containerd, as ctr sees it); closed when the test
// ends.
func podNetns(t testing.TB, env map[string]string, uid string) netns.NsHandle {
	t.Helper()
	ctr := filepath.Join(env["CARVE_CONTAINERD_BIN_DIR"], "ctr")
	ids := strings.Fields(run(t, ctr, "--address", env["CARVE_CONTAINERD_ADDRESS"], "-n", "k8s.io", "containers", "ls", "-q",
		`labels."io.kubernetes.pod.uid"==`+uid+`,labels."io.cri-containerd.kind"==sandbox`))
	if len(ids) != 1 {
		t.Fatalf("sandboxes of pod %s: %q", uid, ids)
	}
	for _, line := range strings.Split(run(t, ctr, "--address", env["CARVE_CONTAINERD_ADDRESS"], "-n", "k8s.io", "tasks", "ls"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != ids[0] {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("ctr tasks ls: %q", line)
		}
		h, err := netns.GetFromPid(pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	t.Fatalf("no task of sandbox %s", ids[0])
	return 0
}

// TestNodeUnsharedTrafficKeepsTheFloors (issue 42; make soak,
// CARVE_E2E_BORROW_ONOFF=1) is netdev's TestUnsharedTrafficHasItsClass on
// the real node: with netdev.unsharedFloorPercent 5 on a 1G NIC, the node's
// own bulk TCP on the parent (from an address of the node's own namespace)
// beside a pod borrowing the link, both saturated, each way: the pod gets at
// least its 300M floor and the node at least its 50M, within 1% at L2, and
// the excess splits by their floors; the node's traffic alone has the link.
func TestNodeUnsharedTrafficKeepsTheFloors(t *testing.T) {
	if os.Getenv("CARVE_E2E_BORROW_ONOFF") != "1" {
		t.Skip("set CARVE_E2E_BORROW_ONOFF=1 to run (make soak)")
	}
	cs, env := borrowNode(t, "  unsharedFloorPercent: 5\n")
	quietHost(t)
	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["borrow"],"interfaceName":"net1"}`
	sharePod{name: "bw300", parent: borrowParent, class: borrowClass, capacity: bothWays("300M"), netCfg: netCfg, image: "carve-net-test:e2e"}.start(t, cs)
	waitFor(t, "pod bw300", 90*time.Second, podRunning(cs, testNS, "bw300"))
	p, err := cs.CoreV1().Pods(testNS).Get(context.Background(), "bw300", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := podNetns(t, env, string(p.UID))
	podIP := strings.Split(strings.Fields(podExec(t, testNS, "bw300", "main", "ip", "-4", "-o", "addr", "show", "net1"))[3], "/")[0]
	server, err := netns.GetFromName(borrowServer)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	// The node's own address on the parent (gone with the veth).
	run(t, "ip", "addr", "add", "10.87.0.254/24", "dev", borrowParent, "nodad")
	const met, link = 0.956, 1e9
	for _, egress := range []bool{true, false} {
		dir := map[bool]string{true: "egress", false: "ingress"}[egress]
		hostFlow := nettest.Flow{From: host, To: server, ToAddr: borrowIP + ":5431"}
		shareFlow := nettest.Flow{From: pod, To: server, ToAddr: borrowIP + ":5432"}
		if !egress {
			hostFlow = nettest.Flow{From: server, To: host, ToAddr: "10.87.0.254:5431"}
			shareFlow = nettest.Flow{From: server, To: pod, ToAddr: podIP + ":5432"}
		}
		alone, err := nettest.RunFlows([]nettest.Flow{hostFlow}, time.Second, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := nettest.RunFlows([]nettest.Flow{hostFlow, shareFlow}, 2*time.Second, 3*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodeAlone, node, share := alone[0].Goodput()/met, res[0].Goodput()/met, res[1].Goodput()/met
		t.Logf("%s: the node's TCP alone %.1f Mbit/s at L2; beside the pod borrowing the link: node %.1f, pod %.1f, together %.3f of the link",
			dir, nodeAlone/1e6, node/1e6, share/1e6, (node+share)/link)
		if nodeAlone < 0.95*link || nodeAlone > 1.01*link {
			t.Errorf("%s: the node's traffic alone %.1f Mbit/s at L2, want the link (1G)", dir, nodeAlone/1e6)
		}
		if share < 0.99*300e6 || node < 0.99*50e6 {
			t.Errorf("%s: the pod %.1f and the node %.1f Mbit/s at L2, want at least their floors, 300M and 50M", dir, share/1e6, node/1e6)
		}
		if r := (node - 50e6) / (share - 300e6); r < 0.9/6 || r > 1.1/6 {
			t.Errorf("%s: the excess split %.3f between the node and the pod, want their floors' 0.167 within 10%%", dir, r)
		}
	}
}

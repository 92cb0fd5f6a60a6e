package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf"
)

const (
	escParent = "carve-e2x0"
	escServer = "carve-e2x-srv"
	escIP     = "10.80.0.1"
)

// TestNodeShareEscapes: on the real node, a pod with CAP_NET_RAW (the
// runtime's default) sends raw frames that claim another's identity: a
// source MAC of no share, its neighbour's MAC, its neighbour's IP, an
// in-band VLAN tag, and ARP replies claiming its neighbour's IP. The
// classifier drops every one on the parent (the server's end of the wire
// receives none of them, and its ARP cache is not poisoned), counts them
// by reason, charges nothing to the neighbour, and the pod's own traffic
// still meets its share at L2. A pod given CAP_NET_ADMIN in a DeviceClass
// that sets allowMACChange changes its interface's MAC and still works,
// held to its share both ways; when it adds an address of no share, its
// kernel's ARP replies for it never leave; a macvlan it nests on its
// share's interface (the kernel puts it on the node's NIC) is removed
// within a second, with an Event on the pod; and a claim naming a pool its
// class does not allow is refused at prepare. The pods' image carries
// rawflood (deploy/e2e/rawflood), a static Go binary.
func TestNodeShareEscapes(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
	quietHost(t)
	ctx := context.Background()
	stateDir := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "carve-state")

	trafficServer(t, escParent, "carve-e2x1", escServer, escIP, "5201")
	srvNS, err := netns.GetFromName(escServer)
	if err != nil {
		t.Fatal(err)
	}
	defer srvNS.Close()
	srvH, err := netlink.NewHandleAt(srvNS)
	if err != nil {
		t.Fatal(err)
	}
	defer srvH.Close()
	rx := func() uint64 {
		l, err := srvH.LinkByName("carve-e2x1")
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Statistics.RxBytes
	}
	srvLink, _ := srvH.LinkByName("carve-e2x1")

	buildAgentImage(t, "carve:e2e")
	buildEscapeImage(t)
	// Two pools: the default class, closed by default, is given its one.
	installChartWith(t, env, stateDir, []string{`--set-json=nicClassAllowedPools=["esc"]`},
		nicNodeConfig(escParent, "esc", "10.80.0.0/24", escIP, "  - name: other-tenant\n    cidr: 10.80.1.0/24\n"))
	// The admin's class for pods that may change their MAC.
	macChange := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic-macchange.carve.dev"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "carve.dev" && device.attributes["carve.dev"].kind == "nic"`}}},
		Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "carve.dev", Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","allowMACChange":true,"allowNetAdmin":true,"allowedPools":["esc"]}`)}}}}}}}
	_ = cs.ResourceV1().DeviceClasses().Delete(ctx, macChange.Name, metav1.DeleteOptions{})
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, macChange, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), macChange.Name, metav1.DeleteOptions{})
	})

	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["esc"],"interfaceName":"net1"}`
	sharePod{name: "raw", parent: escParent, capacity: bothWays("20M"), netCfg: netCfg, image: "carve-net-escape:e2e"}.start(t, cs)
	sharePod{name: "admin", parent: escParent, capacity: bothWays("20M"), netCfg: netCfg, class: macChange.Name, image: "carve-net-escape:e2e",
		mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
		}}.start(t, cs)
	ips, macs := map[string]string{}, map[string]string{}
	for _, name := range []string{"raw", "admin"} {
		waitFor(t, "pod "+name, 90*time.Second, podRunning(cs, testNS, name))
		envs := podExec(t, testNS, name, "main", "env")
		ips[name] = strings.Split(envValue(envs, "CARVE_NET_ADDRESSES"), "/")[0]
		if net.ParseIP(ips[name]) == nil {
			t.Fatalf("pod %s: CARVE_NET_ADDRESSES holds no address:\n%s", name, envs)
		}
		macs[name] = shareMAC(t, name)
	}
	shaper, err := bpf.OpenShaper(e2ePins)
	if err != nil {
		t.Fatal(err)
	}
	defer shaper.Close()
	limit := rate("20M")
	srvMAC := srvLink.Attrs().HardwareAddr.String()

	for _, c := range []struct {
		what   string
		args   []string
		reason bpf.SpoofReason
	}{
		{"a source MAC of no share", []string{"-src-mac", "02:ba:d0:00:00:01", "-src-ip", ips["raw"]}, bpf.SpoofSrcMAC},
		{"the neighbour's MAC", []string{"-src-mac", macs["admin"], "-src-ip", ips["raw"]}, bpf.SpoofSrcMAC},
		{"the neighbour's IP", []string{"-src-mac", macs["raw"], "-src-ip", ips["admin"]}, bpf.SpoofSrcIP},
		{"an in-band VLAN tag", []string{"-src-mac", macs["raw"], "-src-ip", ips["raw"], "-vlan", "100"}, bpf.SpoofVLAN},
		{"ARP replies claiming the neighbour's IP", []string{"-src-mac", macs["raw"], "-src-ip", ips["raw"], "-arp-claim", ips["admin"]}, bpf.SpoofARP},
	} {
		before, _ := shaper.Stats()
		drops0, _ := shaper.SpoofDrops()
		rx0 := rx()
		out := podExec(t, testNS, "raw", "main", append([]string{"rawflood", "-if", "net1", "-dst-mac", srvMAC, "-dst-ip", escIP, "-seconds", "2"}, c.args...)...)
		time.Sleep(200 * time.Millisecond)
		got := rx() - rx0
		after, _ := shaper.Stats()
		drops, _ := shaper.SpoofDrops()
		key := bpf.Key{MAC: macs["admin"], Dir: bpf.Egress}
		charged := after[key].Bytes - before[key].Bytes
		dropped := drops[macs["raw"]][c.reason] - drops0[macs["raw"]][c.reason]
		t.Logf("raw frames with %s: %s sent past the classifier, %d dropped as %v; the server's end received %d bytes, the neighbour was charged %d",
			c.what, strings.TrimSpace(out), dropped, c.reason, got, charged)
		if got > 20_000 { // a few of the pods' own ARP and ND frames at most
			t.Errorf("raw frames with %s: %d bytes reached the server's end of the wire", c.what, got)
		}
		if dropped < 1000 {
			t.Errorf("raw frames with %s: %d counted as %v drops", c.what, dropped, c.reason)
		}
		if charged > 1<<16 {
			t.Errorf("raw frames with %s: %d bytes charged to the neighbour", c.what, charged)
		}
	}
	if neigh := run(t, "ip", "-n", escServer, "neigh", "show", ips["admin"]); strings.Contains(neigh, macs["raw"]) {
		t.Errorf("the server's ARP cache was poisoned: %s", neigh)
	}
	// carve shares, on the node, reports them beside the share.
	sharesOut, _ := exec.Command(carveBinary(t), "shares", "-o", "json", "--interval", "0s", "--state-dir", stateDir, "--bpf-pin-dir", e2ePins).Output()
	if !strings.Contains(string(sharesOut), `"source-mac"`) || !strings.Contains(string(sharesOut), `"arp-sender"`) {
		t.Errorf("carve shares does not report the spoofed frames dropped:\n%s", sharesOut)
	}

	// The pod's own traffic still meets its share. The classifier's byte
	// counts are read over 3 s of the transfer, from 1 s after its first
	// bytes (kubectl exec may take seconds to start it on a busy node).
	// A reading over the band is a leak and fails at once; one under it
	// is measured once more: a sender short of CPU reads low (0.933 once
	// in a local make test, the multi-node cluster's tests running
	// beside it, the classifier's bytes at 0.964 meanwhile).
	k := bpf.Key{MAC: macs["raw"], Dir: bpf.Egress}
	for try := 1; ; try++ {
		l2 := make(chan float64, 1)
		base, _ := shaper.Stats()
		go func() {
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if now, _ := shaper.Stats(); now[k].Bytes-base[k].Bytes > 100_000 {
					break
				}
			}
			time.Sleep(time.Second)
			a, _ := shaper.Stats()
			t0 := time.Now()
			time.Sleep(3 * time.Second)
			b, _ := shaper.Stats()
			l2 <- float64(b[k].Bytes-a[k].Bytes) * 8 / time.Since(t0).Seconds()
		}()
		r := <-startIperfTo("raw", escIP, "5201", 8, false)
		if r.err != nil {
			t.Fatalf("the pod's own iperf3: %v", r.err)
		}
		// A TCP flow held to a limit met within 1% measures 0.956 of it as
		// goodput (the headers of every segment); the classifier counts GSO
		// super-packets' headers once, so its byte rate reads about the same.
		goodput, l2ratio := r.bps/limit, <-l2/limit
		t.Logf("the pod's own traffic after the floods, try %d: %.1f Mbit/s goodput (%.3f of its 20M share; classifier bytes %.3f)", try, r.bps/1e6, goodput, l2ratio)
		if goodput > 0.966 || goodput < 0.946 && try == 2 {
			t.Errorf("the pod's own traffic: goodput %.3f of its share, want 0.956 ± 0.01 (the limit met within 1%%)", goodput)
		}
		if goodput >= 0.946 || try == 2 {
			break
		}
	}

	// A pod with CAP_NET_ADMIN adds an address of no share: its own
	// kernel answers ARP for it, with no socket of the pod's. The reply
	// gets the share's checks all the same, and the server never learns
	// the address.
	const stolen = "10.80.0.250"
	drops0, _ := shaper.SpoofDrops()
	podExec(t, testNS, "admin", "main", "ip", "addr", "add", stolen+"/32", "dev", "net1")
	run(t, "ip", "-n", escServer, "neigh", "flush", "all")
	for range 3 { // the server's kernel asks who has it
		run(t, "ip", "netns", "exec", escServer, "bash", "-c", "echo who > /dev/udp/"+stolen+"/9")
		time.Sleep(400 * time.Millisecond)
	}
	neigh := run(t, "ip", "-n", escServer, "neigh", "show", stolen)
	drops, _ := shaper.SpoofDrops()
	t.Logf("the server's neighbour entry for the stolen %s: %q; the pod's kernel's ARP replies dropped: %d", stolen, strings.TrimSpace(neigh),
		drops[macs["admin"]][bpf.SpoofARP]-drops0[macs["admin"]][bpf.SpoofARP])
	if strings.Contains(neigh, "lladdr") {
		t.Errorf("the server learned the address the pod stole: %s", neigh)
	}
	if drops[macs["admin"]][bpf.SpoofARP] == drops0[macs["admin"]][bpf.SpoofARP] {
		t.Errorf("no ARP reply of the pod's kernel counted as dropped (%v)", drops[macs["admin"]])
	}
	podExec(t, testNS, "admin", "main", "ip", "addr", "del", stolen+"/32", "dev", "net1")

	// The same pod nests a macvlan on its share's interface: the kernel
	// puts it on the node's NIC, outside the share's checks. The agent
	// removes it within a second, and tells the pod why.
	nested := podExec(t, testNS, "admin", "main", "sh", "-c",
		"ip link add link net1 name spy type macvlan && echo made; sleep 1; ip link show spy 2>&1 || echo gone")
	t.Logf("a macvlan nested on net1, then 1 s later: %q", strings.Fields(nested))
	if !strings.Contains(nested, "made") || !strings.Contains(nested, "gone") {
		t.Errorf("a macvlan the pod nested on its share: %q, want made and then gone within 1 s", nested)
	}
	waitFor(t, "the pod told of its nested link's removal", 30*time.Second, func() (bool, error) {
		ev, err := cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=admin,reason=NestedLinkRemoved"})
		if err != nil || len(ev.Items) == 0 {
			return false, err
		}
		t.Logf("pod admin: %s: %s", ev.Items[0].Reason, ev.Items[0].Message)
		return true, nil
	})

	// A claim names a pool its class does not allow (another tenant's
	// subnet): refused at prepare, naming the pool and the class's.
	foreign := sharePod{name: "foreign-pool", parent: escParent, capacity: bothWays("20M"), class: macChange.Name, image: "carve-net-escape:e2e",
		netCfg: `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["other-tenant"],"interfaceName":"net1"}`}
	foreign.start(t, cs)
	const refusal = `pool "other-tenant" is not one the DeviceClass allows (esc)`
	waitFor(t, "the foreign pool refused", 60*time.Second, func() (bool, error) {
		ev, err := cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + foreign.name})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, e := range ev.Items {
			if strings.Contains(e.Message, refusal) {
				t.Logf("pod %s: %s: %s", foreign.name, e.Reason, e.Message)
				return true, nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events %q", seen)
	})
	if p, err := cs.CoreV1().Pods(testNS).Get(ctx, foreign.name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if p.Status.Phase == corev1.PodRunning {
		t.Errorf("the pod of a claim naming a foreign pool is running")
	}
	_ = cs.CoreV1().Pods(testNS).Delete(ctx, foreign.name, metav1.DeleteOptions{})

	// CAP_NET_ADMIN in the default class: the hook refuses the container,
	// which never starts, and the pod's events say which class option
	// would allow it.
	netAdmin := sharePod{name: "netadmin-denied", parent: escParent, capacity: bothWays("20M"), netCfg: netCfg, image: "carve-net-escape:e2e",
		mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
		}}
	netAdmin.start(t, cs)
	waitFor(t, "the NET_ADMIN container refused", 90*time.Second, func() (bool, error) {
		ev, err := cs.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + netAdmin.name})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, e := range ev.Items {
			if strings.Contains(e.Message, "has CAP_NET_ADMIN") && strings.Contains(e.Message, "allowNetAdmin") {
				t.Logf("pod %s: %s: %s", netAdmin.name, e.Reason, e.Message)
				return true, nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events %q", seen)
	})
	if p, err := cs.CoreV1().Pods(testNS).Get(ctx, netAdmin.name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else {
		// Not the pod's phase: a container whose start failed (a hook
		// of runc create's) counts as restarting, and the kubelet
		// reports such a pod Running. What must not be is a container
		// that ran.
		for _, c := range p.Status.ContainerStatuses {
			ran := c.State.Running != nil || c.State.Terminated != nil && !c.State.Terminated.StartedAt.IsZero() && c.State.Terminated.StartedAt.Unix() > 0 ||
				c.LastTerminationState.Terminated != nil && c.LastTerminationState.Terminated.StartedAt.Unix() > 0
			if ran {
				t.Errorf("the container %s with CAP_NET_ADMIN in the default class ran: %+v", c.Name, c)
			}
		}
	}
	_ = cs.CoreV1().Pods(testNS).Delete(ctx, netAdmin.name, metav1.DeleteOptions{})

	// "Still works": traffic flows both ways, never over the share (the
	// first seconds after the change go to ARP and the classifier's
	// learning, so the floor is loose).
	podExec(t, testNS, "admin", "main", "ip", "link", "set", "net1", "address", "02:ba:d0:00:00:02")
	r := <-startIperfTo("admin", escIP, "5201", 4, false)
	if r.err != nil {
		t.Fatalf("iperf3 after the MAC change (class allows it): %v", r.err)
	}
	t.Logf("egress after changing its MAC: %.1f Mbit/s (share 20M)", r.bps/1e6)
	if r.bps > 1.02*limit || r.bps < 0.5*limit {
		t.Errorf("after changing its MAC the pod sent %.1f Mbit/s; want its 20M share", r.bps/1e6)
	}
	// Towards it too: the server learns the new MAC by ARP, the pod's
	// answers teach the classifier its new MAC, and its ingress holds.
	run(t, "ip", "-n", escServer, "neigh", "flush", "all")
	r = <-startIperfTo("admin", escIP, "5201", 4, true)
	if r.err != nil {
		t.Fatalf("iperf3 towards the pod after the MAC change: %v", r.err)
	}
	t.Logf("ingress after changing its MAC: %.1f Mbit/s (share 20M)", r.bps/1e6)
	if r.bps > 1.02*limit || r.bps < 0.5*limit {
		t.Errorf("after changing its MAC the pod received %.1f Mbit/s; want its 20M share", r.bps/1e6)
	}
}

// buildEscapeImage is the net-test image with rawflood, built static here.
func buildEscapeImage(t testing.TB) {
	t.Helper()
	root := repoRoot()
	bin := filepath.Join(t.TempDir(), "rawflood")
	cmd := exec.Command("go", "build", "-o", bin, "./deploy/e2e/rawflood")
	cmd.Dir, cmd.Env = root, append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build rawflood: %v\n%s", err, out)
	}
	args := []string{"--name", "carve-net-escape:e2e", "--file", "/bin/busybox:/bin/busybox", "--file", "/usr/bin/iperf3:/usr/bin/iperf3",
		"--file", bin + ":/bin/rawflood", "--out", filepath.Join(t.TempDir(), "net-escape.tar")}
	for _, applet := range []string{"sh", "ip", "env", "sleep", "cat", "ls"} {
		args = append(args, "--symlink", "/bin/"+applet+"=busybox")
	}
	archive := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), args...)))
	run(t, filepath.Join(root, "deploy/images/import.sh"), archive)
}

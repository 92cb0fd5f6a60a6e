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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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
// runtime's default) floods raw frames with a forged source MAC (one of no
// share, then its neighbour's), and a pod given CAP_NET_ADMIN changes its
// interface's MAC and sends TCP: each stays within its 20M egress share,
// and the neighbour is not charged for the forged frames. The pods' image
// carries rawflood (deploy/e2e/rawflood), a static Go binary.
func TestNodeShareEscapes(t *testing.T) {
	cs := client(t)
	env := clusterEnv(t)
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
	installChart(t, env, stateDir, fmt.Sprintf(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: ["%s"]
  includeVirtual: true
  bandwidth:
  - interface: "%s"
    egress: 10G
  pools:
  - name: esc
    cidr: 10.80.0.0/24
    gateway: %s
`, escParent, escParent, escIP))

	netCfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["esc"],"interfaceName":"net1"}`
	for _, name := range []string{"raw", "admin"} {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
			Spec: shareClaimSpec(escParent, map[resourceapi.QualifiedName]resource.Quantity{
				"egressBandwidth": resource.MustParse("20M"), "ingressBandwidth": resource.MustParse("20M")}, netCfg)}
		if _, err := cs.ResourceV1().ResourceClaims(testNS).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.ResourceV1().ResourceClaims(testNS).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		p := podWithImage(name, "carve-net-escape:e2e", &corev1.PodResourceClaim{Name: "net", ResourceClaimName: ptr.To(name)})
		if name == "admin" {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
		}
		startPod(t, cs, p)
	}
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

	for what, src := range map[string]string{"a MAC of no share": "02:ba:d0:00:00:01", "the neighbour's MAC": macs["admin"]} {
		before, _ := shaper.Stats()
		rx0, t0 := rx(), time.Now()
		out := podExec(t, testNS, "raw", "main", "rawflood", "-if", "net1", "-src-mac", src, "-dst-mac", srvLink.Attrs().HardwareAddr.String(),
			"-src-ip", ips["raw"], "-dst-ip", escIP, "-seconds", "3")
		time.Sleep(200 * time.Millisecond)
		got := float64(rx()-rx0) * 8 / time.Since(t0).Seconds()
		after, _ := shaper.Stats()
		key := bpf.Key{MAC: macs["admin"], Dir: bpf.Egress}
		charged := after[key].Bytes - before[key].Bytes
		t.Logf("raw frames from %s: %s sent, the server got %.1f Mbit/s (share 20M), the neighbour was charged %d bytes", what, strings.TrimSpace(out), got/1e6, charged)
		if got > 1.2*limit {
			t.Errorf("raw frames with %s: %.1f Mbit/s left the node, over the 20M share", what, got/1e6)
		}
		if charged > 1<<20 {
			t.Errorf("raw frames with %s: %d bytes charged to the neighbour", what, charged)
		}
	}

	podExec(t, testNS, "admin", "main", "ip", "link", "set", "net1", "address", "02:ba:d0:00:00:02")
	r := <-startIperfTo("admin", escIP, "5201", 4, false)
	if r.err != nil {
		t.Fatalf("iperf3 after the MAC change: %v", r.err)
	}
	t.Logf("egress after changing its MAC: %.1f Mbit/s (share 20M)", r.bps/1e6)
	if r.bps > 1.02*limit {
		t.Errorf("after changing its MAC the pod sent %.1f Mbit/s, over its 20M share", r.bps/1e6)
	}
	// Towards it too: the server learns the new MAC by ARP, the pod's
	// answers teach the classifier its new MAC, and its ingress holds.
	run(t, "ip", "-n", escServer, "neigh", "flush", "all")
	r = <-startIperfTo("admin", escIP, "5201", 4, true)
	if r.err != nil {
		t.Fatalf("iperf3 towards the pod after the MAC change: %v", r.err)
	}
	t.Logf("ingress after changing its MAC: %.1f Mbit/s (share 20M)", r.bps/1e6)
	if r.bps > 1.02*limit {
		t.Errorf("after changing its MAC the pod received %.1f Mbit/s, over its 20M share", r.bps/1e6)
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

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestMultiNodeIsolation checks netdev/ISOLATION.md on the shared segment:
// who reaches whom by macvlan mode and segment, on the same node and
// across nodes. vepa on a segment that does not hairpin: not a pod on the
// same parent, but one on another node; with the node's segment port
// hairpinning, both. private: never a pod on the same parent, hairpin or
// not, but one on another node.
func TestMultiNodeIsolation(t *testing.T) {
	c := multiNodeCluster(t, 2)
	cs := client(t)
	c.importImages(t)
	c.installChart(t, c.poolConfig())
	parent := c.env["CARVE_SEGMENT_PARENT"]
	// The mode is the DeviceClass's (the admin's), not the claim's.
	for _, m := range []string{"vepa", "private"} {
		cfg := `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","allowedPools":["seg"],"macvlanMode":"` + m + `"}`
		dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "iso-" + m},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "carve.dev" && device.attributes["carve.dev"].kind == "nic"`}}},
				Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
					Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "carve.dev", Parameters: runtime.RawExtension{Raw: []byte(cfg)}}}}}}}
		if _, err := cs.ResourceV1().DeviceClasses().Create(context.Background(), dc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{})
		})
	}
	pods := []struct {
		name, mode string
		node       int
	}{{"iso-a", "vepa", 1}, {"iso-b", "vepa", 1}, {"iso-c", "vepa", 2}, {"iso-p", "private", 1}}
	addr := map[string]string{}
	for _, p := range pods {
		sharePod{name: p.name, parent: parent, capacity: bothWays("50M"), netCfg: mnNetCfg, class: "iso-" + p.mode, image: "carve-net-test:e2e", mutate: c.onNode(p.node)}.start(t, cs)
	}
	for _, p := range pods {
		waitFor(t, "pod "+p.name, 2*time.Minute, podRunning(cs, testNS, p.name))
		f := strings.Fields(podExec(t, testNS, p.name, "main", "ip", "-4", "-o", "addr", "show", "net1"))
		if len(f) < 4 {
			t.Fatalf("pod %s has no address on net1", p.name)
		}
		addr[p.name] = strings.Split(f[3], "/")[0]
	}
	check := func(segment, from, to string, want bool) {
		t.Helper()
		if got := podReaches(from, addr[to]); got != want {
			t.Errorf("%s: %s reaches %s (%s): %v, want %v", segment, from, to, addr[to], got, want)
		} else {
			t.Logf("%s: %s reaches %s: %v", segment, from, to, got)
		}
	}
	check("no hairpin", "iso-a", "iso-b", false)
	check("no hairpin", "iso-a", "iso-c", true)
	check("no hairpin", "iso-p", "iso-b", false)
	check("no hairpin", "iso-p", "iso-c", true)
	// The node's port on the segment reflects frames back (a switch port
	// with reflective relay).
	port := "cvmn-s1"
	run(t, "bridge", "link", "set", "dev", port, "hairpin", "on")
	t.Cleanup(func() { _ = runQuiet("bridge", "link", "set", "dev", port, "hairpin", "off") })
	check("hairpin", "iso-a", "iso-b", true)
	check("hairpin", "iso-a", "iso-c", true)
	check("hairpin", "iso-p", "iso-b", false)
	check("hairpin", "iso-b", "iso-p", false)
	check("hairpin", "iso-p", "iso-c", true)
}

// podReaches says whether pod gets an answer to a
// ping of addr (three tries, a second each).
func podReaches(pod, addr string) bool {
	kc := os.Getenv("CARVE_KUBECONFIG")
	kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
	err := execCommand(kubectl, "--kubeconfig", kc, "exec", "-n", testNS, pod, "-c", "main", "--",
		"ping", "-c", "3", "-W", "1", addr).Run()
	return err == nil
}

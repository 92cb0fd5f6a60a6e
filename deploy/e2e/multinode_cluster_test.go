package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMultiNodeCluster: every node of make cluster-up NODES=N is Ready and
// is a node of its own: it sees only its own interfaces (eth0 on the node
// network, seg0 on the tenants' segment), its own bpffs and hostname, and
// nothing of another node's processes.
func TestMultiNodeCluster(t *testing.T) {
	c := multiNodeCluster(t, 2)
	cs := client(t)
	for i := 1; i <= c.nodes; i++ {
		name := c.name(i)
		waitFor(t, "node "+name+" Ready", 30*time.Second, nodeReady(cs, name))
		n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != c.env[fmt.Sprintf("CARVE_NODE_%d_IP", i)] {
			t.Errorf("node %s: addresses %v, want its node IP first", name, n.Status.Addresses)
		}
		if got := strings.TrimSpace(c.exec(t, i, "hostname")); got != name {
			t.Errorf("node %d: hostname %q, want %q", i, got, name)
		}
		links := strings.Fields(c.exec(t, i, "ls", "/sys/class/net"))
		for _, want := range []string{"eth0", "seg0", "lo"} {
			if !slices.Contains(links, want) {
				t.Errorf("node %d: /sys/class/net %v has no %s", i, links, want)
			}
		}
		for _, l := range links {
			if strings.HasPrefix(l, "cvmn-") {
				t.Errorf("node %d sees the host's link %s", i, l)
			}
		}
		if fs := strings.TrimSpace(c.exec(t, i, "stat", "-f", "-c", "%T", "/sys/fs/bpf")); fs != "bpf_fs" {
			t.Errorf("node %d: /sys/fs/bpf is %s, want its own bpffs", i, fs)
		}
		// PID 1 of the node is its init: the node's processes only.
		if comm := strings.TrimSpace(c.exec(t, i, "cat", "/proc/1/comm")); comm != "bash" {
			t.Errorf("node %d: PID 1 is %q, want the node's init", i, comm)
		}
	}
}

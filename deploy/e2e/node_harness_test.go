package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// clusterEnv reads the cluster.env that up.sh writes beside the kubeconfig,
// and skips (fails, where required) when the cluster has no real node.
func clusterEnv(t testing.TB) map[string]string {
	t.Helper()
	path := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "cluster.env")
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("cluster env: %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			env[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	if n := env["CARVE_CLUSTER_NODES"]; n != "" && n != "1" {
		// The single node's tests make their NICs and servers on the
		// host, where several nodes' agents do not look (multinode_*).
		t.Skipf("the cluster has %s nodes; this test needs the single node (make cluster-up)", n)
	}
	if env["CARVE_CLUSTER_NODE"] == "0" || env["KUBELET_ROOT_DIR"] == "" {
		if os.Getenv("CARVE_E2E_NODE_REQUIRED") == "1" {
			t.Fatal("the cluster has no real node, but CARVE_E2E_NODE_REQUIRED=1")
		}
		t.Skip("the cluster was started without a node (CARVE_CLUSTER_NODE=0)")
	}
	sharedHost(t)
	return env
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

// buildAgentImage builds carve into an image and imports it into the node's
// containerd, as a user without a registry would.
func buildAgentImage(t testing.TB, tag string) {
	t.Helper()
	bin := carveBinary(t)
	if other := os.Getenv("CARVE_E2E_AGENT_BINARY"); other != "" {
		// Another build of the agent (an earlier version, to measure
		// against), with its carve-hook beside it where it has one.
		bin = other
	}
	buildAgentImageFrom(t, tag, bin)
}

// buildAgentImageFrom builds the agent's image from the carve binary bin,
// with the carve-hook beside it where there is one.
func buildAgentImageFrom(t testing.TB, tag, bin string) {
	t.Helper()
	root := repoRoot()
	args := agentImageArgs(tag, bin)
	importOnce(t, strings.Join(args, "\x00"), func() {
		args := append(append(args, "--out", filepath.Join(t.TempDir(), "carve.tar")), nvmlDeps()...)
		archive := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), args...)))
		run(t, filepath.Join(root, "deploy/images/import.sh"), archive)
	})
}

// agentImageArgs are build.sh's arguments for the agent's image of the
// carve binary bin, with the carve-hook beside it where there is one.
func agentImageArgs(tag, bin string) []string {
	args := []string{"--name", tag, "--file", bin + ":/carve", "--file", "/usr/share/misc/pci.ids:/usr/share/misc/pci.ids", "--entrypoint", "/carve"}
	if hook := filepath.Join(filepath.Dir(bin), "carve-hook"); fileExists(hook) {
		args = append(args, "--file", hook+":/carve-hook")
	}
	return args
}

// imported are the images this test process has built and imported into
// the cluster's containerd, keyed by the cluster and what went into each:
// node tests ask for the same images one after another, and building the
// agent's (an archive of its 86 MiB binary) and importing it again took
// seconds each time. Nothing removes an image during a run.
var imported sync.Map

// importOnce runs build, which builds and imports an image, unless an
// image of the same key was imported into this cluster already.
func importOnce(t testing.TB, key string, build func()) {
	t.Helper()
	key = os.Getenv("CARVE_KUBECONFIG") + "\x00" + key
	if _, done := imported.Load(key); done {
		return
	}
	build()
	if !t.Failed() {
		imported.Store(key, true)
	}
}

// nvmlDeps are the --file arguments for what the host's libnvidia-ml.so.1,
// dlopened by the agent, needs beside libc (ldd cannot see a dlopen).
func nvmlDeps() []string {
	libcs, _ := filepath.Glob("/lib/*/libc.so.6")
	if len(libcs) == 0 {
		return nil
	}
	var args []string
	for _, lib := range []string{"libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"} {
		if p := filepath.Join(filepath.Dir(libcs[0]), lib); fileExists(p) {
			args = append(args, "--file", p)
		}
	}
	return args
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// exec runs a command in a pod's container through the API server and the
// kubelet, as kubectl exec does.
func podExec(t testing.TB, ns, pod, container string, cmd ...string) string {
	t.Helper()
	kubectl := filepath.Join(filepath.Dir(os.Getenv("CARVE_KUBECONFIG")), "bin", "kubectl")
	args := append([]string{"--kubeconfig", os.Getenv("CARVE_KUBECONFIG"), "exec", "-n", ns, pod, "-c", container, "--"}, cmd...)
	return run(t, kubectl, args...)
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
}

func podRunning(cs kubernetes.Interface, ns, name string) func() (bool, error) {
	return func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, fmt.Errorf("pod %s: phase %s, %s", name, p.Status.Phase, podWhy(p))
	}
}

func podWhy(p *corev1.Pod) string {
	var why []string
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why = append(why, c.Message)
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			why = append(why, s.State.Waiting.Reason+": "+s.State.Waiting.Message)
		}
	}
	return strings.Join(why, "; ")
}

// restartKubelet stops the node's kubelet and starts it again with the same
// command line, log and pid file, as a node reboot of the kubelet alone.
func restartKubelet(t testing.TB) {
	t.Helper()
	dir := filepath.Dir(os.Getenv("CARVE_KUBECONFIG"))
	pidFile := filepath.Join(dir, "pids", "kubelet.pid")
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(raw))
	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	run(t, "kill", pid)
	waitFor(t, "the kubelet to exit", 30*time.Second, func() (bool, error) {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		return err != nil || strings.Contains(string(st), ") Z "), nil
	})
	logFile := filepath.Join(dir, "logs", "kubelet.log")
	cmd := exec.Command("setsid", append([]string{"sh", "-c", `echo $$ > "$0"; log=$1; shift; exec "$@" >>"$log" 2>&1 </dev/null`, pidFile, logFile}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
}

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

// chartDir is the chart the node tests install: this tree's, or the one
// CARVE_E2E_CHART names (an earlier version's, to measure against).
func chartDir() string {
	if dir := os.Getenv("CARVE_E2E_CHART"); dir != "" {
		return dir
	}
	return filepath.Join(repoRoot(), "deploy/chart/carve")
}

// vethParent makes parent, a NIC for a test's shares: one end of a veth
// pair on the node, both ends up. It goes when the test ends.
func vethParent(t testing.TB, parent, peer string) {
	t.Helper()
	run(t, "ip", "link", "add", parent, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = runQuiet("ip", "link", "del", parent) })
	run(t, "ip", "link", "set", parent, "up")
	run(t, "ip", "link", "set", peer, "up")
}

// sharedNICConfig is the node config that publishes parent alone, as a
// shareable NIC of 10G each way.
func sharedNICConfig(parent string) string {
	return fmt.Sprintf(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: [%q]
  includeVirtual: true
  bandwidth:
  - interface: %q
    egress: 10G
    ingress: 10G
`, parent, parent)
}

// trafficServer makes the NIC a test shares: a veth parent on the node whose
// peer sits in its own namespace at ip/24, with an iperf3 server on each
// port. All of it goes when the test ends.
func trafficServer(t testing.TB, parent, peer, ns, ip string, ports ...string) {
	t.Helper()
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = runQuiet("ip", "netns", "del", ns) })
	run(t, "ip", "link", "add", parent, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = runQuiet("ip", "link", "del", parent) })
	run(t, "ip", "link", "set", peer, "netns", ns)
	run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", peer)
	run(t, "ip", "-n", ns, "link", "set", peer, "up")
	run(t, "ip", "link", "set", parent, "up")
	for _, port := range ports {
		// -J: a client's --get-server-output then brings the
		// server's intervals, the receiver's for egress.
		srv := exec.Command("ip", "netns", "exec", ns, "iperf3", "-s", "-J", "-p", port)
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	}
}

// removeCarveShapers deletes carve's ingress IFBs (cvifb*) and egress
// shapers (cveg*, veth pairs) from the node's namespace, as a test that
// ends leaves no links behind.
func removeCarveShapers() {
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, "cvifb") && l.Type() == "ifb" || strings.HasPrefix(name, "cveg") && l.Type() == "veth" {
			_ = netlink.LinkDel(l)
		}
	}
}

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// multiNodeRequiredEnv, set to 1, makes the multi-node tests fail, not
// skip, where the cluster is not a multi-node one (make multinode-e2e).
const multiNodeRequiredEnv = "CARVE_E2E_MULTINODE_REQUIRED"

// mnCluster is a multi-node local cluster (make cluster-up NODES=N), as
// its cluster.env describes it.
type mnCluster struct {
	env   map[string]string
	nodes int
}

// multiNodeCluster reads cluster.env and skips (fails, where required)
// unless the cluster has at least min nodes made of namespaces.
func multiNodeCluster(t testing.TB, minNodes int) *mnCluster {
	t.Helper()
	skip := func(why string) {
		if os.Getenv(multiNodeRequiredEnv) == "1" {
			t.Fatalf("%s, but %s=1", why, multiNodeRequiredEnv)
		}
		t.Skip(why)
	}
	kc := os.Getenv("CARVE_KUBECONFIG")
	if kc == "" {
		skip("CARVE_KUBECONFIG is not set (make cluster-up NODES=3)")
	}
	env, err := readEnvFile(filepath.Join(filepath.Dir(kc), "cluster.env"))
	if err != nil {
		skip(fmt.Sprintf("cluster env: %v", err))
	}
	n, _ := strconv.Atoi(env["CARVE_CLUSTER_NODES"])
	if n < minNodes {
		skip(fmt.Sprintf("the cluster has %d nodes made of namespaces, this test needs %d (make cluster-up NODES=%d)", n, minNodes, minNodes))
	}
	sharedHost(t)
	return &mnCluster{env: env, nodes: n}
}

// name is node i's Node name (i from 1).
func (c *mnCluster) name(i int) string { return c.env[fmt.Sprintf("CARVE_NODE_%d_NAME", i)] }

// exec runs a command inside node i (its network, mount, UTS and PID
// namespaces) and returns its stdout; the test fails where it fails.
func (c *mnCluster) exec(t testing.TB, i int, args ...string) string {
	t.Helper()
	out, err := c.execErr(i, args...)
	if err != nil {
		t.Fatalf("node %d: %v", i, err)
	}
	return out
}

// execErr is exec, returning its failure.
func (c *mnCluster) execErr(i int, args ...string) (string, error) {
	pid := c.env[fmt.Sprintf("CARVE_NODE_%d_PID", i)]
	if pid == "" {
		return "", fmt.Errorf("no node %d in cluster.env", i)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command("nsenter", append([]string{"--target", pid, "--mount", "--uts", "--net", "--pid", "--"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %w\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String(), nil
}

// readEnvFile reads KEY=VALUE lines.
func readEnvFile(path string) (map[string]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(k, "#") {
			env[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return env, nil
}

// mnPoolConfig is the node config every node of the multi-node tests has
// (the chart's one nodeConfig): the node's seg0 shared, 10G each way, and
// one cluster-wide pool on the segment, the server's address its gateway.
func (c *mnCluster) poolConfig() string {
	return fmt.Sprintf(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: [%q]
  includeVirtual: true
  bandwidth:
  - {interface: %q, egress: 10G}
  pools:
  - {name: seg, cidr: %s, gateway: %s}
`, c.env["CARVE_SEGMENT_PARENT"], c.env["CARVE_SEGMENT_PARENT"], c.env["CARVE_SEGMENT_CIDR"], c.env["CARVE_SEGMENT_SERVER_IP"])
}

// mnImagesImported names the cluster (its first node's init PID) whose
// nodes have this process's images: they are built and imported once per
// test binary.
var (
	mnImagesMu       sync.Mutex
	mnImagesImported string
)

// importImages builds the agent's image (tag carve:mn) and the pods'
// (carve-net-test:e2e), and imports both into every node's containerd,
// once per test process and cluster.
func (c *mnCluster) importImages(t testing.TB) {
	t.Helper()
	mnImagesMu.Lock()
	defer mnImagesMu.Unlock()
	if mnImagesImported == c.env["CARVE_NODE_1_PID"] {
		return
	}
	root := repoRoot()
	dir := t.TempDir()
	agent := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"),
		append(append(agentImageArgs("carve:mn", carveBinary(t)), "--out", filepath.Join(dir, "carve.tar")), nvmlDeps()...)...)))
	netArgs := []string{"--name", "carve-net-test:e2e", "--file", "/bin/busybox:/bin/busybox", "--file", "/usr/bin/iperf3:/usr/bin/iperf3", "--out", filepath.Join(dir, "net.tar")}
	for _, applet := range []string{"sh", "ip", "env", "sleep", "cat", "ls", "ping"} {
		netArgs = append(netArgs, "--symlink", "/bin/"+applet+"=busybox")
	}
	net := strings.TrimSpace(lastLine(run(t, filepath.Join(root, "deploy/images/build.sh"), netArgs...)))
	for i := 1; i <= c.nodes; i++ {
		cmd := exec.Command(filepath.Join(root, "deploy/images/import.sh"), agent, net)
		cmd.Env = append(os.Environ(), "CARVE_CLUSTER_DIR="+c.env["CARVE_CLUSTER_DIR"],
			"CARVE_CONTAINERD_ADDRESS="+c.env[fmt.Sprintf("CARVE_NODE_%d_CONTAINERD_ADDRESS", i)])
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("import into node %d: %v\n%s", i, err, out)
		}
	}
	mnImagesImported = c.env["CARVE_NODE_1_PID"]
}

// installChart installs the chart with its default paths (each node's
// own), the agent on the node's network (hostNetwork, unless values say
// otherwise) reaching the API server on the node network's bridge. It is
// uninstalled when the test ends, and the pool's records with it.
func (c *mnCluster) installChart(t testing.TB, nodeConfig string, values ...string) {
	t.Helper()
	helm := os.Getenv("CARVE_HELM")
	if helm == "" {
		t.Fatal("CARVE_HELM is not set")
	}
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte(nodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	kc := os.Getenv("CARVE_KUBECONFIG")
	t.Cleanup(func() {
		if err := runQuiet(helm, "uninstall", "carve", "--kubeconfig", kc, "--namespace", chartNamespace, "--wait", "--timeout", "90s"); err != nil {
			_ = runQuiet(helm, "uninstall", "carve", "--kubeconfig", kc, "--namespace", chartNamespace, "--wait", "--timeout", "60s", "--no-hooks")
		}
		kubectl := filepath.Join(filepath.Dir(kc), "bin", "kubectl")
		_ = runQuiet(kubectl, "--kubeconfig", kc, "delete", "leases", "-n", chartNamespace, "-l", "carve.dev/address-pool", "--wait=false")
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs, warnings and errors:\n%s", klogWarnings(agentLogs(), 30))
		}
	})
	args := []string{"install", "carve", chartDir(), "--kubeconfig", kc,
		"--namespace", chartNamespace, "--create-namespace", "--wait", "--timeout", "180s",
		"--set", "image.repository=carve,image.tag=mn,image.pullPolicy=Never",
		"--set", "hostNetwork=true",
		"--set-string", "extraEnv[0].name=KUBERNETES_SERVICE_HOST,extraEnv[0].value=" + c.env["CARVE_APISERVER_HOST"],
		"--set-string", "extraEnv[1].name=KUBERNETES_SERVICE_PORT,extraEnv[1].value=" + c.env["CARVE_APISERVER_PORT"],
		"--set-file", "nodeConfig=" + cfg}
	run(t, helm, append(args, values...)...)
}

// iperfServers runs an iperf3 server on each port in the segment's server
// namespace, until the test ends.
func (c *mnCluster) iperfServers(t testing.TB, ports ...string) {
	t.Helper()
	for _, port := range ports {
		srv := exec.Command("ip", "netns", "exec", c.env["CARVE_SEGMENT_SERVER_NS"], "iperf3", "-s", "-J", "-p", port)
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	}
}

// onNode places a pod on node i.
func (c *mnCluster) onNode(i int) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": c.name(i)} }
}

// A multi-node cluster (cluster/nodes.sh) may run on the same host as the
// single node's tests (make e2e runs both at once). Its nodes' processes
// live under the cgroup root /carve-mn, and its host-side links are named
// cvmn-*: the single node's tests leave both alone.

// ofMultiNodeCluster says whether process pid is one of a multi-node
// cluster's nodes.
func ofMultiNodeCluster(pid int) bool {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(cg), ":/carve-mn/")
}

// multiNodeClusterLink says whether a link of the host's namespace is a
// multi-node cluster's (its bridges and its nodes' ends of their veths).
func multiNodeClusterLink(name string) bool { return strings.HasPrefix(name, "cvmn-") }

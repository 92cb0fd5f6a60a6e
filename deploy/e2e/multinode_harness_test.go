package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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

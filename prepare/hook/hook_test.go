package hook_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/prepare/hook"
)

func TestContainerPID(t *testing.T) {
	pid, err := hook.ContainerPID(strings.NewReader(`{"ociVersion":"1.2.0","id":"c1","status":"created","pid":4242,"bundle":"/b"}`))
	if err != nil || pid != 4242 {
		t.Errorf("ContainerPID = %d, %v", pid, err)
	}
	for in, want := range map[string]string{
		`{"ociVersion":"1.2.0","id":"c1","status":"creating"}`: `no pid (container "c1", status "creating")`,
		`not json`: "OCI state on stdin",
		``:         "OCI state on stdin",
	} {
		if _, err := hook.ContainerPID(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ContainerPID(%q) = %v; want an error with %q", in, err, want)
		}
	}
}

// The resctrl hook writes the pid to the group's tasks; a refused write
// quotes the kernel's reason, and a group that is gone is never created.
func TestAddResctrlTask(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "carve-a"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "info"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "carve-a", "tasks"), nil, 0o644))
	must(t, hook.AddResctrlTask(dir, "carve-a", 77))
	if b, _ := os.ReadFile(filepath.Join(dir, "carve-a", "tasks")); string(b) != "77" {
		t.Errorf("tasks = %q", b)
	}
	must(t, os.WriteFile(filepath.Join(dir, "info", "last_cmd_status"), []byte("Task not found\n"), 0o644))
	err := hook.AddResctrlTask(dir, "carve-gone", 77)
	if err == nil || !strings.Contains(err.Error(), "resctrl: Task not found") || !strings.Contains(err.Error(), `"carve-gone"`) {
		t.Errorf("a group that is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "carve-gone")); !os.IsNotExist(err) {
		t.Errorf("the missing group was created: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if err := hook.AddResctrlTask(dir, bad, 1); err == nil {
			t.Errorf("group %q accepted", bad)
		}
	}
}

// Main's exit codes, which the runtime and carve's CLI rely on: 2 for a
// command line that lacks what the hook needs, 1 for a hook that failed.
func TestMainExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, hook.Usage},
		{[]string{"bogus"}, 2, `no hook "bogus"`},
		{[]string{"netns-attach"}, 2, "--spec FILE is required"},
		{[]string{"netns-attach", "--spec", "x", "extra"}, 2, "unexpected arguments"},
		{[]string{"resctrl-attach"}, 2, "--group NAME is required"},
		{[]string{"dmem-limit", "--region", "r"}, 2, "--region and --max are required"},
		{[]string{"dmem-limit", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"netns-attach", "--spec", "/nonexistent.json"}, 1, "attach spec"},
	} {
		var stderr bytes.Buffer
		if code := hook.Main(tc.args, strings.NewReader(""), &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("Main(%v) = %d, %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The bundle's config.json names the sandbox's network namespace, which
// the hook takes; a bundle without one, or none at all, names none.
func TestBundleNetns(t *testing.T) {
	root := t.TempDir()
	bundle := "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1"
	must(t, os.MkdirAll(filepath.Join(root, bundle), 0o755))
	netnsOf := func(bundle string) (string, error) {
		b, err := hook.ReadBundle(root, bundle)
		return b.Netns(), err
	}
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"ociVersion":"1.2.0","linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1234"}]}}`), 0o644))
	if got, err := netnsOf(bundle); err != nil || got != "/var/run/netns/cni-1234" {
		t.Errorf("Netns = %q, %v", got, err)
	}
	if got, err := netnsOf("/no/such/bundle"); err != nil || got != "" {
		t.Errorf("a missing bundle: %q, %v", got, err)
	}
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"linux":{"namespaces":[{"type":"pid"}]}}`), 0o644))
	if got, err := netnsOf(bundle); err != nil || got != "" {
		t.Errorf("no network namespace: %q, %v", got, err)
	}
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"linux":`), 0o644))
	if _, err := netnsOf(bundle); err == nil || !strings.Contains(err.Error(), bundle) {
		t.Errorf("a torn config.json: %v", err)
	}
}

// A restricted pod's container, as containerd 2 wrote its bundle on this
// project's local node (testdata, recorded): the sandbox's namespace, and
// no capability that could reshape the pod's network (all dropped).
func TestBundleOfARestrictedPod(t *testing.T) {
	root := t.TempDir()
	bundle := "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c2"
	must(t, os.MkdirAll(filepath.Join(root, bundle), 0o755))
	raw, err := os.ReadFile("testdata/restricted-pod-config.json")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), raw, 0o644))
	b, err := hook.ReadBundle(root, bundle)
	must(t, err)
	if ns := b.Netns(); !strings.HasPrefix(ns, "/proc/") && !strings.Contains(ns, "netns") {
		t.Errorf("Netns = %q, want the sandbox's", ns)
	}
	if c, err := b.NetAdmin(); err != nil || c != "" {
		t.Errorf("NetAdmin = %q, %v; want none", c, err)
	}
	// The same bundle with NET_ADMIN added to one set.
	var cfg map[string]any
	must(t, json.Unmarshal(raw, &cfg))
	caps := cfg["process"].(map[string]any)["capabilities"].(map[string]any)
	caps["permitted"] = []string{"CAP_NET_ADMIN"}
	raw, err = json.Marshal(cfg)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), raw, 0o644))
	if b, err = hook.ReadBundle(root, bundle); err != nil {
		t.Fatal(err)
	}
	if c, err := b.NetAdmin(); err != nil || c != "CAP_NET_ADMIN" {
		t.Errorf("NetAdmin with CAP_NET_ADMIN permitted = %q, %v", c, err)
	}
	// Without a config.json, nothing says what the container may do.
	must(t, os.Remove(filepath.Join(root, bundle, "config.json")))
	if b, err = hook.ReadBundle(root, bundle); err != nil {
		t.Fatal(err)
	}
	if _, err := b.NetAdmin(); err == nil {
		t.Error("NetAdmin of a bundle without config.json: no error")
	}
}

// A pid that is not in the sandbox's network namespace is refused before
// anything is touched: the pid could name any process by now.
func TestAttachRefusesAPidOutsideTheSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to read another process's namespace")
	}
	other := exec.Command("unshare", "--net", "sleep", "30")
	if err := other.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	sandbox := fmt.Sprintf("/proc/%d/ns/net", other.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; {
		mine, _ := os.Readlink("/proc/self/ns/net")
		theirs, _ := os.Readlink(sandbox)
		if theirs != "" && theirs != mine {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other process never got its own network namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	root := t.TempDir()
	bundle := "/bundle"
	must(t, os.MkdirAll(filepath.Join(root, bundle), 0o755))
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"process":{"capabilities":{}},"linux":{"namespaces":[{"type":"network","path":"`+sandbox+`"}]}}`), 0o644))
	spec := filepath.Join(t.TempDir(), "spec.json")
	must(t, os.WriteFile(spec, []byte(`{"hostName":"cv0","parent":"eth0","podName":"net1"}`), 0o644))
	// /proc is read under root "/" for the pid, and the bundle under root:
	// run with the real root and an absolute bundle path instead.
	realBundle := filepath.Join(root, bundle)
	state := fmt.Sprintf(`{"ociVersion":"1.2.0","id":"c","pid":%d,"bundle":%q}`, os.Getpid(), realBundle)
	err := hook.RunAttach(spec, "/", strings.NewReader(state))
	if err == nil || !strings.Contains(err.Error(), "is not in the pod sandbox's network namespace") {
		t.Errorf("attach with a pid outside the sandbox: %v", err)
	}
}

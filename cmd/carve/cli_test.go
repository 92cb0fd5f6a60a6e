package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildCarve compiles this command once per test binary run.
func buildCarve(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "carve-cmd-test"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "carve")
		tags, err := buildTags()
		if err != nil {
			built.err = err
			return
		}
		if out, err := exec.Command("go", "build", "-tags", tags, "-o", bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// runCarve runs the built binary and returns its stdout, stderr and exit
// status.
func runCarve(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(buildCarve(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	}
	t.Fatalf("carve %v: %v", args, err)
	return "", "", 0
}

// help runs `carve args... --help` in this process and returns what it printed.
func help(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := execute(context.Background(), append(args, "--help"), &stdout, &stderr); code != 0 {
		t.Fatalf("carve %v --help: exit %d\n%s", args, code, stderr.String())
	}
	return stdout.String()
}

func TestHelpListsCommands(t *testing.T) {
	out := help(t)
	for _, name := range []string{"agent", "discover", "hook", "completion"} {
		if !regexp.MustCompile(`(?m)^  ` + name + ` +\S`).MatchString(out) {
			t.Errorf("carve --help does not list %s:\n%s", name, out)
		}
	}
	if out := help(t, "hook"); !regexp.MustCompile(`(?m)^  netns-attach +\S`).MatchString(out) {
		t.Errorf("carve hook --help does not list netns-attach:\n%s", out)
	}
}

// contractFlag is a flag that the chart, the demo, the e2e tests or a CDI
// spec pass: its name, shorthand and default must not change.
type contractFlag struct{ name, shorthand, def string }

// checkFlags checks that `carve args --help` shows every contract flag and
// that the command defines it with its shorthand and default.
func checkFlags(t *testing.T, args []string, want []contractFlag) {
	t.Helper()
	out := help(t, args...)
	cmd, _, err := newRootCommand().Find(args)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		spelled := "    --" + w.name + " "
		if w.shorthand != "" {
			spelled = "-" + w.shorthand + ", --" + w.name + " "
		}
		if !strings.Contains(out, spelled) {
			t.Errorf("carve %v --help lacks %q:\n%s", args, spelled, out)
		}
		f := cmd.Flags().Lookup(w.name)
		if f == nil {
			f = cmd.InheritedFlags().Lookup(w.name)
		}
		if f == nil {
			t.Errorf("carve %v has no --%s", args, w.name)
			continue
		}
		if f.Shorthand != w.shorthand || f.DefValue != w.def {
			t.Errorf("carve %v --%s: shorthand %q, default %q; want %q, %q", args, w.name, f.Shorthand, f.DefValue, w.shorthand, w.def)
		}
	}
}

func TestAgentFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	t.Setenv("POD_UID", "uid-a")
	checkFlags(t, []string{"agent"}, []contractFlag{
		{"kubeconfig", "", ""},
		{"node-name", "", "node-a"},
		{"root", "", "/"},
		{"cpu-cache-root", "", ""},
		{"config", "", ""},
		{"kubelet-registrar-dir", "", "/var/lib/kubelet/plugins_registry"},
		{"kubelet-plugins-dir", "", "/var/lib/kubelet/plugins"},
		{"cdi-dir", "", "/var/run/cdi"},
		{"state-dir", "", "/var/lib/carve"},
		{"metrics-addr", "", "127.0.0.1:9464"},
		{"profiling", "", "false"},
		{"health-addr", "", "127.0.0.1:9465"},
		{"pod-uid", "", "uid-a"},
		{"rescan-interval", "", "1m0s"},
		{"registration-wait", "", "30s"},
		{"kube-api-qps", "", "200"},
		{"kube-api-burst", "", "400"},
		{"host-netns", "", ""},
		{"bpf-pin-dir", "", "/sys/fs/bpf/carve"},
		{"v", "v", "0"},
		{"vmodule", "", ""},
		{"logging-format", "", "text"},
	})
}

func TestDiscoverFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	checkFlags(t, []string{"discover"}, []contractFlag{
		{"root", "", "/"},
		{"cpu-cache-root", "", ""},
		{"node-name", "", "node-a"},
		{"config", "", ""},
		{"output", "o", "yaml"},
		{"v", "v", "0"},
		{"vmodule", "", ""},
		{"logging-format", "", "text"},
	})
}

func TestHookFlags(t *testing.T) {
	checkFlags(t, []string{"hook", "netns-attach"}, []contractFlag{
		{"spec", "", ""},
		{"root", "", "/"},
	})
}

// TestContractCommandLines runs the command lines that the chart and the e2e
// harness build: every flag must parse, so that the agent gets as far as
// reading its (missing) config file.
func TestContractCommandLines(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "node.yaml")
	chart := []string{"agent", "--node-name=n1", "--pod-uid=uid", "--root=/host", "--cpu-cache-root=/host/x",
		"--kubelet-registrar-dir=" + dir, "--kubelet-plugins-dir=" + dir, "--cdi-dir=" + dir, "--state-dir=" + dir,
		"--metrics-addr=:0", "--health-addr=:0", "--rescan-interval=30s", "--bpf-pin-dir=" + dir,
		"--config=" + missing, "-v=1"}
	harness := []string{"agent", "--kubeconfig", "kc", "--node-name", "n1", "--root", dir,
		"--kubelet-registrar-dir", dir, "--kubelet-plugins-dir", dir, "--cdi-dir", dir, "--state-dir", dir,
		"--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0", "--rescan-interval", "1s",
		"--host-netns", dir, "--bpf-pin-dir", dir, "--kube-api-qps", "5", "--kube-api-burst", "10",
		"--config", missing, "-v", "1"}
	for _, args := range [][]string{chart, harness} {
		_, stderr, code := runCarve(t, "", args...)
		if code != 1 || !strings.HasPrefix(stderr, "carve agent: ") || !strings.Contains(stderr, missing) {
			t.Errorf("carve %v: exit %d, stderr %q; want exit 1 and an error about %s", args, code, stderr, missing)
		}
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		prefix string
	}{
		{nil, 2, "carve: "},
		{[]string{"frobnicate"}, 2, "carve: "},
		{[]string{"agent", "--bogus"}, 2, "carve agent: "},
		{[]string{"agent", "extra"}, 2, "carve agent: "},
		{[]string{"discover", "--logging-format=xml"}, 2, "carve discover: "},
		{[]string{"hook"}, 2, "carve hook: "},
		{[]string{"hook", "bogus"}, 2, "carve hook: "},
		{[]string{"discover", "--config", "/nonexistent.yaml"}, 1, "carve discover: "},
		{[]string{"hook", "netns-attach", "--spec", "/nonexistent.json"}, 1, "carve hook netns-attach: "},
	} {
		_, stderr, code := runCarve(t, "", tc.args...)
		if code != tc.code || !strings.HasPrefix(stderr, tc.prefix) {
			t.Errorf("carve %v: exit %d, stderr %q; want exit %d and %q first", tc.args, code, stderr, tc.code, tc.prefix)
		}
	}
}

// TestHookNetnsAttach runs the hook as containerd does: the spec by flag, the
// OCI state on stdin, the bundle under the root. The pid is not a process
// here, so the hook stops at opening its network namespace, having read all
// three.
func TestHookNetnsAttach(t *testing.T) {
	spec := filepath.Join(t.TempDir(), "share.json")
	if err := os.WriteFile(spec, []byte(`{"hostName":"cv0","parent":"eth0","podName":"net1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "b", "config.json"), []byte(`{"ociVersion":"1.2.0","process":{"capabilities":{"bounding":["CAP_CHOWN"]}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := runCarve(t, `{"ociVersion":"1.2.0","id":"c","pid":999999999,"bundle":"/b"}`, "hook", "netns-attach", "--spec", spec, "--root", root)
	if code != 1 || !strings.Contains(stderr, "network namespace of pid 999999999") {
		t.Errorf("exit %d, stderr %q; want the pod's namespace looked up for pid 999999999", code, stderr)
	}
	_, stderr, _ = runCarve(t, "", "hook", "netns-attach", "--spec", spec)
	if !strings.Contains(stderr, "OCI state on stdin") {
		t.Errorf("with no OCI state, stderr %q does not say so", stderr)
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_carve", "zsh": "#compdef carve", "fish": "complete -c carve"} {
		stdout, stderr, code := runCarve(t, "", "completion", shell)
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("carve completion %s: exit %d, stderr %q; want a script with %q", shell, code, stderr, want)
		}
	}
}

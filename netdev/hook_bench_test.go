package netdev_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

// hookBinEnv names a carve-hook binary to measure instead of one built from
// this tree (to compare with an older build).
const hookBinEnv = "CARVE_HOOK_BIN"

// BenchmarkHookExec measures what containerd pays per container start of a
// pod with a NIC share: exec of the netns-attach hook, as the runtime runs
// it (in the node's namespace, the OCI state on stdin), to exit. "first"
// makes the share's interface in a new pod (the first container);
// "steady" finds it there and only checks it (every later container). The
// small static carve-hook is measured beside the same hook run from the
// agent's binary (`carve hook netns-attach`, bin/carve from make build), the
// reference: what the hook cost when it was linked with the agent. Each
// binary's size and package count are reported too.
func BenchmarkHookExec(b *testing.B) {
	hooks := []struct {
		name string
		bin  string
		args []string
		pkg  string
	}{
		{"carve-hook", hookBinary(b), nil, "../cmd/carve-hook"},
		{"carve", "../bin/carve", []string{"hook"}, "../cmd/carve"},
	}
	for _, h := range hooks {
		b.Run(h.name, func(b *testing.B) {
			if _, err := os.Stat(h.bin); err != nil {
				b.Skipf("no %s (make build makes it): %v", h.bin, err)
			}
			for _, first := range []bool{true, false} {
				b.Run(map[bool]string{true: "first", false: "steady"}[first], func(b *testing.B) {
					benchHookExec(b, first, h.bin, h.args)
				})
			}
			b.Run("binary", func(b *testing.B) {
				for b.Loop() {
				}
				st, err := os.Stat(h.bin)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(st.Size())/(1<<20), "MiB")
				if os.Getenv(hookBinEnv) == "" || h.name != "carve-hook" {
					out, err := exec.Command("go", "list", "-deps", h.pkg).Output()
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(strings.Count(string(out), "\n")), "packages")
				}
			})
		})
	}
}

func benchHookExec(b *testing.B, first bool, bin string, args []string) {
	env := newBench(b)
	var steady *share
	var steadyPID int
	if !first {
		steady = env.add("steady", "", "", nil)
		steadyPID = podProcess(b, env, "steady")
	}
	var took []time.Duration
	i := 0
	round := func() {
		spec, pid := steady.specFile(env), steadyPID
		if first {
			b.StopTimer()
			name := fmt.Sprintf("f%d", i)
			a := env.alloc(name, "", "")
			env.prepareSpec(a, nil)
			spec = filepath.Join(env.state, "netdev", netdev.LinkName(a.ShareKey())+".json")
			podNS := env.tp.NewPod(name)
			_ = podNS.Close()
			pid = podProcess(b, env, name)
			b.StartTimer()
		}
		i++
		d, err := execHook(env.tp.Node, bin, args, spec, pid)
		if err != nil {
			b.Fatal(err)
		}
		took = append(took, d)
	}
	for b.Loop() {
		round()
	}
	for len(took) < 50 {
		round()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "exec-p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "exec-p99-ms")
	b.ReportMetric(float64(len(took)), "samples")
}

func (s *share) specFile(env *bench) string {
	if s == nil {
		return ""
	}
	return filepath.Join(env.state, "netdev", netdev.LinkName(s.alloc.ShareKey())+".json")
}

// hookBinary builds carve-hook as the Makefile does, or takes $CARVE_HOOK_BIN.
func hookBinary(b *testing.B) string {
	if bin := os.Getenv(hookBinEnv); bin != "" {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "carve-hook")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "../cmd/carve-hook")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build carve-hook: %v\n%s", err, out)
	}
	return bin
}

// podProcess starts a process in the test pod's namespace, for the hook to
// find by pid, and stops it when the benchmark ends.
func podProcess(b *testing.B, env *bench, pod string) int {
	cmd := env.tp.Exec(pod, "sleep", "3600")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// ip netns exec enters the namespace, then execs sleep in place.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe"); strings.HasSuffix(exe, "/sleep") {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the pod's process did not start")
		}
		time.Sleep(time.Millisecond)
	}
	return cmd.Process.Pid
}

// execHook runs the hook from a thread in the node's namespace, as the
// runtime does, and times it from exec to exit. The container's bundle is
// a restricted pod's as containerd 2 wrote it (recorded in
// prepare/hook/testdata: about 10 KB, most of it the seccomp profile), its
// network namespace the pod process's.
func execHook(node netns.NsHandle, bin string, args []string, spec string, pid int) (time.Duration, error) {
	bundle := filepath.Join(filepath.Dir(spec), "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return 0, err
	}
	config, err := restrictedBundle(pid)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		return 0, err
	}
	var took time.Duration
	err = nettest.In(node, func() error {
		cmd := exec.Command(bin, append(args, "netns-attach", "--spec", spec)...)
		cmd.Stdin = strings.NewReader(fmt.Sprintf(`{"ociVersion":"1.2.0","id":"c","status":"created","pid":%d,"bundle":%q}`, pid, bundle))
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		took = time.Since(t0)
		if err != nil {
			return fmt.Errorf("%s netns-attach: %v\n%s", bin, err, out)
		}
		return nil
	})
	return took, err
}

// restrictedBundle is the recorded restricted pod's config.json with its
// network namespace the one of pid.
func restrictedBundle(pid int) ([]byte, error) {
	raw, err := os.ReadFile("../prepare/hook/testdata/restricted-pod-config.json")
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Linux struct {
			Namespaces []map[string]string `json:"namespaces"`
		} `json:"linux"`
	}
	var whole map[string]json.RawMessage
	if err := json.Unmarshal(raw, &whole); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	var linux map[string]json.RawMessage
	if err := json.Unmarshal(whole["linux"], &linux); err != nil {
		return nil, err
	}
	for _, ns := range cfg.Linux.Namespaces {
		if ns["type"] == "network" {
			ns["path"] = fmt.Sprintf("/proc/%d/ns/net", pid)
		}
	}
	if linux["namespaces"], err = json.Marshal(cfg.Linux.Namespaces); err != nil {
		return nil, err
	}
	if whole["linux"], err = json.Marshal(linux); err != nil {
		return nil, err
	}
	return json.Marshal(whole)
}

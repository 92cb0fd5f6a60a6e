package dmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/prepare/hook"
)

// fakeCgroupfs makes a cgroup v2 tree with a kubelet pod and its container,
// dmem enabled nowhere yet, and a process in the container.
func fakeCgroupfs(t *testing.T) (root, proc, pod string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "cgroup")
	proc = filepath.Join(base, "proc")
	pod = filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod1234_abcd.slice")
	ctr := filepath.Join(pod, "cri-containerd-ff.scope")
	for _, d := range []string{root, filepath.Dir(filepath.Dir(pod)), filepath.Dir(pod), pod, ctr} {
		must(t, os.MkdirAll(d, 0o755))
		must(t, os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("cpu memory\n"), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "dmem.max"), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(d, "dmem.min"), nil, 0o644))
	}
	must(t, os.WriteFile(filepath.Join(root, "dmem.capacity"), []byte("drm/0000:03:00.0/vram0 8514437120\nnvidia/0000:19:00.0/vidmem 85520809984\n"), 0o644))
	must(t, os.MkdirAll(filepath.Join(proc, "4242"), 0o755))
	rel := strings.TrimPrefix(ctr, root)
	must(t, os.WriteFile(filepath.Join(proc, "4242", "cgroup"), []byte("0::"+rel+"\n"), 0o644))
	return root, proc, pod
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRegionFor(t *testing.T) {
	root, _, _ := fakeCgroupfs(t)
	capacity, err := Capacity(root)
	must(t, err)
	if got, ok := RegionFor(capacity, "00000000:19:00.0"); !ok || got != "nvidia/0000:19:00.0/vidmem" {
		t.Errorf("RegionFor(NVML bus id) = %q, %v", got, ok)
	}
	if _, ok := RegionFor(capacity, "0000:03:00.0"); ok {
		t.Error("a drm region was taken for an NVIDIA GPU")
	}
	if _, err := Capacity(t.TempDir()); !os.IsNotExist(unwrapAll(err)) {
		t.Errorf("Capacity without the file: %v, want not-exist", err)
	}
	if _, err := ParseCapacity(strings.NewReader("nvidia/x/vidmem lots\n")); err == nil {
		t.Error("a bad size was accepted")
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestHookWritesPodLimits(t *testing.T) {
	root, proc, pod := fakeCgroupfs(t)
	l := hook.DmemLimit{Region: "nvidia/0000:19:00.0/vidmem", Max: 10 << 30, Min: 10 << 30}
	record := filepath.Join(t.TempDir(), "record")
	must(t, hook.RunDmemLimit(strings.NewReader(`{"ociVersion":"1.2.0","id":"c","pid":4242}`), root, proc, l, record))
	for _, f := range []string{"dmem.max", "dmem.min"} {
		got, err := hook.ReadDmem(filepath.Join(pod, f), l.Region)
		must(t, err)
		if got != "10737418240" {
			t.Errorf("%s = %q, want 10737418240", f, got)
		}
	}
	// dmem is enabled from the root down to the pod's parent, not in the
	// pod (its containers need no dmem files of their own).
	for d := root; d != pod; {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		if !strings.Contains(string(b), "dmem") {
			t.Errorf("%s: dmem not enabled: %q", d, b)
		}
		rel, _ := filepath.Rel(d, pod)
		d = filepath.Join(d, strings.Split(rel, "/")[0])
	}
	if b, _ := os.ReadFile(filepath.Join(pod, "cgroup.subtree_control")); strings.Contains(string(b), "dmem") {
		t.Errorf("dmem enabled inside the pod: %q", b)
	}
	// The container's own cgroup is untouched.
	if b, _ := os.ReadFile(filepath.Join(pod, "cri-containerd-ff.scope", "dmem.max")); len(b) != 0 {
		t.Errorf("container dmem.max written: %q", b)
	}
	// The pod is recorded, and the record checks out: held to the slice,
	// with what the pod holds from dmem.current.
	pods, err := hook.RecordedPodCgroups(record, root)
	must(t, err)
	if len(pods) != 1 || pods[0] != pod {
		t.Fatalf("recorded %v, want [%s]", pods, pod)
	}
	must(t, os.WriteFile(filepath.Join(pod, "dmem.current"), []byte(l.Region+" 4096\n"), 0o644))
	if used, problems := Held(pods, l.Region, l.Max); used != 4096 || len(problems) != 0 {
		t.Errorf("Held = %d, %v", used, problems)
	}
	if _, problems := Held(pods, l.Region, l.Max-1); len(problems) != 1 {
		t.Errorf("a limit over a smaller slice passed: %v", problems)
	}
	// Its limit gone (the file rewritten to max, as a cgroup made again
	// has it): not held.
	must(t, os.WriteFile(filepath.Join(pod, "dmem.max"), []byte(l.Region+" max\n"), 0o644))
	if _, problems := Held(pods, l.Region, l.Max); len(problems) != 1 || !strings.Contains(problems[0], "no limit") {
		t.Errorf("an unlimited pod passed: %v", problems)
	}
	// A pod that ended is not a problem.
	if _, problems := Held([]string{filepath.Join(root, "gone")}, l.Region, l.Max); len(problems) != 0 {
		t.Errorf("a gone pod: %v", problems)
	}
	if got, err := hook.RecordedPodCgroups(filepath.Join(t.TempDir(), "none"), root); err != nil || len(got) != 0 {
		t.Errorf("no record directory: %v, %v", got, err)
	}
}

func TestHookRefusals(t *testing.T) {
	root, proc, _ := fakeCgroupfs(t)
	l := hook.DmemLimit{Region: "nvidia/0000:19:00.0/vidmem", Max: 1 << 30}
	for name, state := range map[string]string{
		"no pid":    `{"id":"c"}`,
		"not json":  `pid=4242`,
		"gone":      `{"pid":999}`,
		"not a pod": `{"pid":1}`,
	} {
		if name == "not a pod" {
			must(t, os.MkdirAll(filepath.Join(proc, "1"), 0o755))
			must(t, os.WriteFile(filepath.Join(proc, "1", "cgroup"), []byte("0::/init.scope\n"), 0o644))
		}
		if err := hook.RunDmemLimit(strings.NewReader(state), root, proc, l, ""); err == nil {
			t.Errorf("%s: hook succeeded", name)
		}
	}
	must(t, os.MkdirAll(filepath.Join(proc, "7"), 0o755))
	must(t, os.WriteFile(filepath.Join(proc, "7", "cgroup"), []byte("12:memory:/kubepods/pod1/c\n"), 0o644))
	if _, err := hook.PodCgroup(root, proc, 7); err == nil || !strings.Contains(err.Error(), "cgroup v1") {
		t.Errorf("cgroup v1 process: %v", err)
	}
	for _, bad := range []hook.DmemLimit{{Region: "", Max: 1}, {Region: "r", Max: 0}, {Region: "r", Max: 1, Min: 2}, {Region: "a b", Max: 1}} {
		if err := hook.ApplyDmem(root, filepath.Join(root, "x"), bad); err == nil {
			t.Errorf("limit %+v accepted", bad)
		}
	}
	if err := hook.ApplyDmem(root, "/elsewhere", l); err == nil {
		t.Error("a cgroup outside the root was written")
	}
}

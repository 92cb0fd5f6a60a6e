package proccgroup_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/proccgroup"
)

func TestParse(t *testing.T) {
	hybrid := "12:cpu,cpuacct:/kubepods/pod1\n1:name=systemd:/kubepods/pod1/c\n0::/kubepods.slice/kubepods-pod1.slice/cri-c.scope\n"
	e, err := proccgroup.Parse(hybrid)
	if err != nil {
		t.Fatal(err)
	}
	if len(e) != 3 || e[0].Hierarchy != 12 || strings.Join(e[0].Controllers, "+") != "cpu+cpuacct" || e[1].Controllers[0] != "name=systemd" {
		t.Errorf("entries: %+v", e)
	}
	if got := proccgroup.Unified(e); got != "/kubepods.slice/kubepods-pod1.slice/cri-c.scope" {
		t.Errorf("Unified = %q", got)
	}
	if got := proccgroup.Unified(e[:2]); got != "" {
		t.Errorf("v1 only: Unified = %q, want none", got)
	}
	for _, bad := range []string{"garbage", "x::/a", "-1::/a", "0:/a"} {
		if _, err := proccgroup.Parse(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Parse(%q) = %v; want an error naming line 1", bad, err)
		}
	}
}

func TestRead(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "42", "cgroup"), []byte("0::/a/b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := proccgroup.Read(proc, 42); err != nil || proccgroup.Unified(e) != "/a/b" {
		t.Errorf("Read = %+v, %v", e, err)
	}
	if _, err := proccgroup.Read(proc, 43); err == nil || !strings.Contains(err.Error(), "process 43") {
		t.Errorf("a missing process: %v", err)
	}
}

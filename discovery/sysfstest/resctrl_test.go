package sysfstest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/carve-dra/carve/discovery/sysfstest"
)

func resctrlTree(t *testing.T, closids int) *sysfstest.ResctrlFS {
	tree := sysfstest.New(t.TempDir())
	tree.AddLLC(sysfstest.LLC{ID: 0, CPUs: []int{0}, Size: "16M", Ways: 11})
	tree.AddLLC(sysfstest.LLC{ID: 1, CPUs: []int{1}, Size: "16M", Ways: 11})
	tree.AddResctrlShareable("7ff", "600", 2, closids)
	tree.AddMBA(10, 10)
	return tree.ResctrlFS()
}

func read(t *testing.T, f *sysfstest.ResctrlFS, rel string) string {
	t.Helper()
	b, err := f.ReadFile(rel)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The fake refuses what the kernel refuses, whole, and says why in
// last_cmd_status; what it takes changes only the domains written.
func TestFakeResctrlValidatesSchemata(t *testing.T) {
	f := resctrlTree(t, 4)
	if got := read(t, f, "schemata"); got != "L3:0=7ff;1=7ff\nMB:0=100;1=100" {
		t.Fatalf("default schemata = %q", got)
	}
	for _, tc := range []struct{ write, status string }{
		{"L3:0=505", "non-consecutive"},
		{"L3:0=800", "out of range"},
		{"L3:0=0", "out of range"},
		{"L3:0=4", "at least 2 bits"},
		{"L3:0=zz", "Non-hex"},
		{"L3:2=f", "unknown domain"},
		{"L3:0=f;0=f0", "Duplicate domain"},
		{"L2:0=f", "Unknown or unsupported resource"},
		{"L3:1=f0\nMB:0=5", "out of range"},
	} {
		err := f.WriteFile("schemata", []byte(tc.write))
		if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: %v, want EINVAL", tc.write, err)
		}
		if st := read(t, f, "info/last_cmd_status"); !strings.Contains(st, tc.status) {
			t.Errorf("%q: last_cmd_status %q, want %q", tc.write, st, tc.status)
		}
	}
	if got := read(t, f, "schemata"); got != "L3:0=7ff;1=7ff\nMB:0=100;1=100" {
		t.Errorf("schemata after refused writes = %q, want unchanged", got)
	}
	if err := f.WriteFile("schemata", []byte("L3:1=0f0\nMB:1=30\n")); err != nil {
		t.Fatal(err)
	}
	if got := read(t, f, "schemata"); got != "L3:0=7ff;1=0f0\nMB:0=100;1=30" {
		t.Errorf("schemata = %q, want only domain 1 changed", got)
	}
}

// mkdir gives a group the kernel's initial masks and runs out of CLOSIDs;
// rmdir sends its tasks home.
func TestFakeResctrlGroups(t *testing.T) {
	f := resctrlTree(t, 3)
	if err := f.WriteFile("schemata", []byte("L3:0=00f")); err != nil {
		t.Fatal(err)
	}
	if err := f.Mkdir("g1"); err != nil {
		t.Fatal(err)
	}
	// Shareable bits, the default group's and the unused ways, cut to
	// their lowest run: 0x00f | 0x600 | 0x7f0 in domain 0.
	if got := read(t, f, "g1/schemata"); got != "L3:0=7ff;1=7ff\nMB:0=100;1=100" {
		t.Errorf("new group schemata = %q", got)
	}
	if err := f.Mkdir("g1"); !errors.Is(err, os.ErrExist) {
		t.Errorf("mkdir again: %v, want exists", err)
	}
	if err := f.Mkdir("g2"); err != nil {
		t.Fatal(err)
	}
	if err := f.Mkdir("g3"); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fourth group with 3 CLOSIDs: %v, want ENOSPC", err)
	}
	if err := f.WriteFile("g1/tasks", []byte("42")); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteFile("g1/tasks", []byte("x")); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("bad pid: %v", err)
	}
	if err := f.Remove("g1"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, f, "tasks"); got != "42" {
		t.Errorf("default group tasks after rmdir = %q, want 42", got)
	}
	if _, err := os.Stat(filepath.Join(f.Dir, "g1")); !os.IsNotExist(err) {
		t.Errorf("g1 still there: %v", err)
	}
}

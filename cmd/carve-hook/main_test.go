package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The hook runs on the host, outside carve's image: built as the Makefile
// builds it, it is a static executable (no ELF interpreter, no shared
// libraries), and it refuses a bad command line with usage.
func TestHookBinaryIsStatic(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "carve-hook")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("carve-hook has an ELF interpreter: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("carve-hook needs shared libraries %v", libs)
	}
	out, err := exec.Command(bin, "netns-attach").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--spec FILE is required") {
		t.Errorf("no --spec: exit %d, %q; want 2 and the usage", code, out)
	}
	for _, args := range [][]string{{"resctrl-attach"}, {"dmem-limit", "--region", "nvidia/0000:19:00.0/vidmem"}, {"no-such-hook"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if code := exitCode(err); code != 2 {
			t.Errorf("%v: exit %d, %q; want 2 and what is missing", args, code, out)
		}
	}
	out, err = exec.Command(bin, "netns-attach", "--spec", filepath.Join(t.TempDir(), "missing.json")).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "attach spec") {
		t.Errorf("a missing spec: exit %d, %q; want 1 naming the spec", code, out)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestContainerdRef(t *testing.T) {
	for in, want := range map[string]string{
		"carve:dev":                  "docker.io/library/carve:dev",
		"carve":                      "docker.io/library/carve:latest",
		"team/carve:1":               "docker.io/team/carve:1",
		"docker.io/carve:1":          "docker.io/library/carve:1",
		"localhost/carve:1":          "localhost/carve:1",
		"localhost:5000/a/b":         "localhost:5000/a/b:latest",
		"registry.example.com/x:1.2": "registry.example.com/x:1.2",
	} {
		ref, tag, err := containerdRef(in)
		if err != nil || ref != want || tag != want[strings.LastIndex(want, ":")+1:] {
			t.Errorf("%s: %s, %s, %v; want %s", in, ref, tag, err, want)
		}
	}
	if _, _, err := containerdRef("Carve:dev"); err == nil {
		t.Error("an upper-case repository was accepted")
	}
}

func TestDefaultOut(t *testing.T) {
	for name, want := range map[string]string{
		"carve:dev":          "/d/carve_dev.tar",
		"carve":              "/d/carve_latest.tar",
		"team/carve":         "/d/team_carve_latest.tar",
		"localhost:5000/foo": "/d/localhost_5000_foo.tar",
	} {
		if got := defaultOut(name, "/d"); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	if got := defaultOut("a:b", ""); got != "/tmp/carve-images/a_b.tar" {
		t.Errorf("no CARVE_IMAGE_DIR: %s", got)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--file", "/bin/true"},                  // no --name
		{"--name", "a"},                          // nothing to put in
		{"--name", "a", "--file"},                // a missing value
		{"--name", "a", "--bogus", "x"},          // unknown option
		{"--name", "a", "--file", "/x", "stray"}, // positional argument
	} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n"
	libs, missing := parseLdd(out)
	if want := []string{"/lib/x86_64-linux-gnu/libm.so.6", "/lib64/ld-linux-x86-64.so.2"}; !slices.Equal(libs, want) || missing != "" {
		t.Errorf("%q, %q; want %q", libs, missing, want)
	}
	if _, missing := parseLdd(out + "\tlibfoo.so.1 => not found\n"); missing != "libfoo.so.1" {
		t.Errorf("missing %q, want libfoo.so.1", missing)
	}
	if libs, _ := parseLdd("\tnot a dynamic executable\n"); len(libs) != 0 {
		t.Errorf("static binary: %q", libs)
	}
}

func TestAddErrors(t *testing.T) {
	r := newRootfs()
	if err := r.addFile("/nonexistent-carve-file"); err == nil {
		t.Error("a missing file was accepted")
	}
	if err := r.addFile(os.Args[0] + ":relative"); err == nil {
		t.Error("a relative destination was accepted")
	}
	if err := r.addSymlink("/bin/sh"); err == nil {
		t.Error("a symlink without a target was accepted")
	}
	if err := r.addSymlink("/tmp=x"); err == nil {
		t.Error("a symlink over a directory was accepted")
	}
	if err := r.addDir(t.TempDir() + "/missing:/x"); err == nil {
		t.Error("a missing directory was accepted")
	}
}

func write(t *testing.T, file, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	// The umask may have cleared bits the test wants.
	if err := os.Chmod(file, mode); err != nil {
		t.Fatal(err)
	}
}

// untar unpacks the archive's files (it has no links) into dir.
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, h.Name), string(b), 0o644) //nolint:gosec // G305: our own archive, read back in a test
		}
	}
}

func oct(mode int64) string { return strconv.FormatInt(mode, 8) }

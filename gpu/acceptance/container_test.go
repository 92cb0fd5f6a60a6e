package acceptance

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount namespaces and device nodes")
	}
}

// The client's /dev holds the basic nodes and the claim's, nothing else;
// the caller's /dev is untouched.
func TestStartWithDevicesShowsOnlyTheClaimsNodes(t *testing.T) {
	needRoot(t)
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// A node given by its host path only (numbers filled from it, as a
	// runtime does), under a subdirectory as nvidia-caps are.
	claim := []*cdispec.DeviceNode{{Path: "/dev/caps/tty0", HostPath: "/dev/tty"}}
	var out bytes.Buffer
	cmd := exec.Command(sh, "-c", `cd /dev && find . | sort && cat /dev/caps/tty0 </dev/null >/dev/null 2>&1; stat -c '%t:%T %a' /dev/caps/tty0; echo x >/dev/null && echo null-writable; (: >/dev/new) 2>/dev/null || echo read-only`)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartWithDevices(cmd, claim); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var host unix.Stat_t
	if err := unix.Stat("/dev/tty", &host); err != nil {
		t.Fatal(err)
	}
	want := []string{".", "./caps", "./caps/tty0", "./null", "./random", "./urandom", "./zero", fmt.Sprintf("5:0 %o", host.Mode&0o777), "null-writable", "read-only"}
	if !slices.Equal(lines, want) {
		t.Fatalf("the client's /dev: %q, want %q", lines, want)
	}
	if _, err := os.Stat("/dev/caps"); err == nil {
		t.Fatal("the client's node reached the caller's /dev")
	}
	if err := StartWithDevices(exec.Command(sh), []*cdispec.DeviceNode{{Path: "/dev/x", HostPath: "/nonexistent-carve"}}); err == nil || !strings.Contains(err.Error(), "/nonexistent-carve") {
		t.Fatalf("a node whose host path is missing: %v", err)
	}
}

// A dynamic executable runs in a root built of it and its libraries, sees
// the host at /host, and the host sees nothing of the binds.
func TestStartChrootedRunsInARootOfItsOwn(t *testing.T) {
	needRoot(t)
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls")
	}
	ls, _ = filepath.EvalSymlinks(ls)
	root := t.TempDir()
	if err := BuildRoot(root, ls, "libm.so.6", "libnot-there.so.9"); err != nil {
		t.Fatal(err)
	}
	files, err := elfClosure(ls)
	if err != nil || len(files) < 3 { // ls, its interpreter, libc at least
		t.Fatalf("%s needs %v (%v): a dynamic executable needs its interpreter and libc", ls, files, err)
	}
	var out bytes.Buffer
	cmd := exec.Command(ls, "/", "/host/etc/hostname")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartChrooted(cmd, root, []Bind{{Source: "/", Target: "/host"}}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if !strings.Contains(out.String(), "/host/etc/hostname") {
		t.Fatalf("the host is not at /host: %s", out.String())
	}
	// Its root holds only what BuildRoot put there and the bind's target.
	for _, name := range strings.Fields(strings.SplitN(out.String(), "/host/etc/hostname", 2)[1]) {
		if !slices.Contains([]string{"host", "lib", "lib64", "usr", "bin"}, strings.TrimSuffix(name, ":")) && name != "/:" {
			t.Errorf("the root holds %q", name)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "host")); len(entries) != 0 {
		t.Fatalf("the bind reached the host's mounts: %v", entries)
	}
}

// What the child mounts below a shared bind shows on the host (the state
// directory's tmpfs of a claim); below a slave bind it does not.
func TestStartChrootedPropagatesOnlySharedBinds(t *testing.T) {
	needRoot(t)
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox")
	}
	bb, _ = filepath.EvalSymlinks(bb)
	root, state, other := t.TempDir(), t.TempDir(), t.TempDir()
	if err := BuildRoot(root, bb); err != nil {
		t.Fatal(err)
	}
	undo, err := ShareMount(state)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := undo(); err != nil {
			t.Error(err)
		}
	}()
	for _, d := range []string{filepath.Join(state, "claim"), filepath.Join(other, "claim")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	cmd := exec.Command(bb, "sh", "-c", "$0 mount -t tmpfs none /st/claim && $0 touch /st/claim/x && $0 mount -t tmpfs none /ot/claim && $0 touch /ot/claim/y", bb)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := StartChrooted(cmd, root, []Bind{{Source: state, Target: "/st", Shared: true}, {Source: other, Target: "/ot"}}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	defer func() { _ = exec.Command("umount", "-l", filepath.Join(state, "claim")).Run() }()
	if _, err := os.Stat(filepath.Join(state, "claim", "x")); err != nil {
		t.Errorf("the child's tmpfs below the shared bind is not on the host: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, "claim", "y")); err == nil {
		t.Error("the child's tmpfs below a slave bind reached the host")
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "st")); len(entries) != 0 {
		t.Errorf("the binds below the root reached the host: %v", entries)
	}
}

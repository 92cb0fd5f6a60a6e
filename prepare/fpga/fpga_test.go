package fpga_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

func entry(nodes ...string) slices.Entry {
	return slices.Entry{Kind: names.KindFPGA, FPGA: &discovery.FPGA{
		PCIFunction: discovery.PCIFunction{Address: "0000:3b:00.0", Driver: "xclmgmt"}, DevNodes: nodes}}
}

var alloc = prepare.Allocation{ClaimUID: "uid", Request: "fpga", Device: "fpga-0000-3b-00-0", Kind: names.KindFPGA}

// The agent runs with --root=/host: nodes are looked up under the root, and
// the CDI spec names them as the host sees them, without it.
func TestDeviceNodesFoundUnderRootNamedWithout(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev/xfpga"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"dev/xclmgmt15104", "dev/xfpga/flash.m15104.0"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := fpga.Preparer{Root: root}.Prepare(context.Background(), alloc, entry("/dev/xclmgmt15104", "/dev/xfpga/flash.m15104.0"))
	if err != nil {
		t.Fatal(err)
	}
	var paths, hostPaths []string
	for _, n := range got.Edits.DeviceNodes {
		paths, hostPaths = append(paths, n.Path), append(hostPaths, n.HostPath)
	}
	want := "/dev/xclmgmt15104 /dev/xfpga/flash.m15104.0"
	if strings.Join(paths, " ") != want || strings.Join(hostPaths, " ") != want {
		t.Errorf("paths %v, host paths %v; want both %s", paths, hostPaths, want)
	}
}

// A node that exists on this machine but not under the root is missing:
// the lookup must not escape the root.
func TestDeviceNodeMissingUnderRoot(t *testing.T) {
	_, err := fpga.Preparer{Root: t.TempDir()}.Prepare(context.Background(), alloc, entry("/dev/null"))
	if err == nil || !strings.Contains(err.Error(), "/dev/null") {
		t.Errorf("error %v, want the node under the root reported missing", err)
	}
}

// A real character device under the root is described by its numbers.
func TestCharDeviceNumbers(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "dev/dfl-port.0"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		if !errors.Is(err, unix.EPERM) {
			t.Fatalf("mknod: %v", err)
		}
		t.Skipf("mknod needs CAP_MKNOD: %v", err)
	}
	got, err := fpga.Preparer{Root: root}.Prepare(context.Background(), alloc, entry("/dev/dfl-port.0"))
	if err != nil {
		t.Fatal(err)
	}
	n := got.Edits.DeviceNodes[0]
	if n.Type != "c" || n.Major != 1 || n.Minor != 3 || n.HostPath != "/dev/dfl-port.0" {
		t.Errorf("node = %+v, want c 1:3 at /dev/dfl-port.0", n)
	}
}

func TestRefused(t *testing.T) {
	p := fpga.Preparer{Root: t.TempDir()}
	for name, tc := range map[string]struct {
		dev  slices.Entry
		want string
	}{
		"no nodes":    {entry(), "no device nodes"},
		"escape":      {entry("/dev/../etc/passwd"), "not a clean path"},
		"not an FPGA": {slices.Entry{Kind: names.KindLLC}, "not an FPGA"},
	} {
		if _, err := p.Prepare(context.Background(), alloc, tc.dev); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}

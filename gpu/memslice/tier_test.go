package memslice

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// A process that does not see the host's PIDs cannot police: an MPS v2 GPU
// is then not sliced at all. The kernel limit needs no policing.
func TestChooseWithoutHostPIDs(t *testing.T) {
	blind := errors.New("this process's PID namespace is not the host's")
	got := Choose(Facts{DriverVersion: "580.159.04", CUDADriverVersion: 13000, PCIAddress: "0000:19:00.0", DmemErr: errors.New("absent"),
		MPSControl: "/usr/bin/x", HostPIDs: blind})
	if got.Tier != TierNone || !strings.Contains(got.Reason, "no policing") || !strings.Contains(got.Reason, blind.Error()) {
		t.Errorf("MPS v2 without the host's PIDs: %+v", got)
	}
	got = Choose(Facts{DriverVersion: "615.10", CUDADriverVersion: 13040, PCIAddress: "0000:19:00.0",
		Dmem: map[string]uint64{"nvidia/0000:19:00.0/vidmem": 1}, MPSControl: "/usr/bin/x", HostPIDs: blind})
	if got.Tier != TierDMEM {
		t.Errorf("dmem without the host's PIDs: %+v", got)
	}
}

// fakeHost is a host root as Detect reads it: the MPS control binary below
// the driver root, dmem.capacity when given, and /proc/1/ns/pid pointing
// at pidNS.
func fakeHost(t *testing.T, capacity, pidNS string) Env {
	t.Helper()
	root := t.TempDir()
	for _, dir := range []string{"usr/bin", "sys/fs/cgroup", "proc/1/ns"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/nvidia-cuda-mps-control"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if capacity != "" {
		if err := os.WriteFile(filepath.Join(root, "sys/fs/cgroup/dmem.capacity"), []byte(capacity), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(pidNS, filepath.Join(root, "proc/1/ns/pid")); err != nil {
		t.Fatal(err)
	}
	return EnvBelow(root, "/")
}

func TestDetect(t *testing.T) {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Skip(err)
	}
	inv := &nvmlinfo.Inventory{DriverVersion: "580.159.04", CUDADriverVersion: 13000, Devices: []nvmlinfo.Device{
		{UUID: "GPU-1", PCIBusID: "00000000:19:00.0"}, {UUID: "GPU-2", PCIBusID: "00000000:1A:00.0", MIGEnabled: true}}}
	tiers := Tiers(inv, fakeHost(t, "", own))
	if tiers["GPU-1"].Enforcement != "mps-policed" || tiers["GPU-2"].Enforcement != "none" {
		t.Errorf("driver 580: %+v", tiers)
	}
	tiers = Tiers(inv, fakeHost(t, "", "pid:[1]"))
	if tiers["GPU-1"].Enforcement != "none" || !strings.Contains(tiers["GPU-1"].Reason, "hostPID") {
		t.Errorf("another PID namespace: %+v", tiers["GPU-1"])
	}
	inv.DriverVersion, inv.CUDADriverVersion = "615.10", 13040
	tiers = Tiers(inv, fakeHost(t, "nvidia/0000:19:00.0/vidmem 85520809984\n", "pid:[1]"))
	if g := tiers["GPU-1"]; g.Enforcement != "dmem" || g.Region != "nvidia/0000:19:00.0/vidmem" {
		t.Errorf("r615 with dmem: %+v", g)
	}
	if len(Tiers(nil, Env{})) != 0 {
		t.Error("tiers without NVML")
	}
}

// Where PID 1's namespace link is denied (the lent GPU machines deny it to
// root), the kernel's initial PID namespace stands for the host's: a
// process in it sees host PIDs, one in another does not.
func TestHostPIDsWherePID1IsDenied(t *testing.T) {
	denied := func(own string) func(string) (string, error) {
		return func(p string) (string, error) {
			if p == "/proc/self/ns/pid" {
				return own, nil
			}
			return "", &fs.PathError{Op: "readlink", Path: p, Err: fs.ErrPermission}
		}
	}
	if err := hostPIDsWith(denied(initPIDNamespace), "/proc"); err != nil {
		t.Errorf("the initial PID namespace, PID 1 denied: %v", err)
	}
	if err := hostPIDsWith(denied("pid:[4026532000]"), "/proc"); err == nil || !strings.Contains(err.Error(), "hostPID") {
		t.Errorf("another PID namespace, PID 1 denied: %v", err)
	}
	missing := func(p string) (string, error) {
		if p == "/proc/self/ns/pid" {
			return initPIDNamespace, nil
		}
		return "", &fs.PathError{Op: "readlink", Path: p, Err: fs.ErrNotExist}
	}
	if err := hostPIDsWith(missing, "/nowhere"); err == nil {
		t.Error("a host /proc without PID 1 was taken for the host's")
	}
}

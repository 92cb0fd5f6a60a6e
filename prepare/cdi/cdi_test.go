package cdi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare/cdi"
)

// A written spec is one the CDI library (as a container runtime uses it)
// reads back with its devices; a removed one is gone, and removing it again
// is no error.
func TestWriteReadByTheLibrary(t *testing.T) {
	dir := t.TempDir()
	w, err := cdi.NewWriter(dir, "carve.dev")
	if err != nil {
		t.Fatal(err)
	}
	devices := []cdispec.Device{{Name: "uid-1-net-nic", ContainerEdits: cdispec.ContainerEdits{
		Env:    []string{"CARVE_NET_DEVICE=nic"},
		Mounts: []*cdispec.Mount{{HostPath: "/run/x.json", ContainerPath: "/run/carve/claims/x.json", Options: []string{"ro", "bind"}}},
	}}}
	if err := w.Write("uid-1", devices); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, w.SpecName("uid-1"))
	spec, err := cdilib.ReadSpec(path, 0)
	if err != nil {
		t.Fatalf("the library cannot read what was written: %v", err)
	}
	if spec.GetDevice("uid-1-net-nic") == nil || spec.Kind != w.Kind() {
		t.Errorf("read back kind %q, devices %v", spec.Kind, spec.Devices)
	}
	if err := w.Remove("uid-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("spec still there after Remove: %v", err)
	}
	if err := w.Remove("uid-1"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// What the library would refuse to read is not written.
func TestWriteRefusesWhatTheRuntimeWouldRefuse(t *testing.T) {
	dir := t.TempDir()
	w, err := cdi.NewWriter(dir, "carve.dev")
	if err != nil {
		t.Fatal(err)
	}
	for name, devices := range map[string][]cdispec.Device{
		"no devices":        nil,
		"bad device name":   {{Name: "a/b", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}},
		"device twice":      {{Name: "a", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}, {Name: "a", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}},
		"env without '='":   {{Name: "a", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A"}}}},
		"hook with no path": {{Name: "a", ContainerEdits: cdispec.ContainerEdits{Hooks: []*cdispec.Hook{{HookName: "createRuntime"}}}}},
	} {
		if err := w.Write("uid-"+strings.ReplaceAll(name, " ", "-"), devices); err == nil {
			t.Errorf("%s: written", name)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files left: %v", entries)
	}
}

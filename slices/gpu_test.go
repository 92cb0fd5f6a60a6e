package slices_test

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// gpuNode discovers the DGX H100's PCI functions (GPU 7 with a VM's NUMA
// node -1) with the given NVML inventory.
func gpuNode(t *testing.T, nvml *nvmlinfo.Inventory, addrs ...string) slices.Result {
	t.Helper()
	if addrs == nil {
		for _, b := range nvmltest.H100BusIDs {
			a, _ := nvmlinfo.NormalizeBusID(b)
			addrs = append(addrs, a)
		}
	}
	tree := sysfstest.GPUNode(t.TempDir(), addrs, func(i int) int {
		if i == 7 {
			return -1
		}
		return i / 4
	})
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root,
		NVML: func(context.Context) (*nvmlinfo.Inventory, error) { return nvml, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Build(inv, nodeconfig.Default(), "node-a")
}

func TestWholeGPUs(t *testing.T) {
	res := gpuNode(t, nvmltest.H100Node())
	devs := devices(res)
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8 whole GPUs", len(devs))
	}
	g := devs["gpu-0000-19-00-0"]
	for attr, want := range map[resourceapi.QualifiedName]string{
		"kind": "gpu", "uuid": nvmltest.H100UUID(0), "productName": "NVIDIA H100 80GB HBM3",
		"architecture": "hopper", "driverVersion": "580.159.04", "pciAddress": "0000:19:00.0",
		"resource.kubernetes.io/pcieRoot": "pci0000:19",
	} {
		if got := str(g, attr); got != want {
			t.Errorf("%s = %q, want %q", attr, got, want)
		}
	}
	if v := g.Attributes["cudaComputeCapability"].VersionValue; v == nil || *v != "9.0.0" {
		t.Errorf("cudaComputeCapability = %v", v)
	}
	if v := g.Attributes["cudaDriverVersion"].VersionValue; v == nil || *v != "13.0.0" {
		t.Errorf("cudaDriverVersion = %v", v)
	}
	if b := g.Attributes["migCapable"].BoolValue; b == nil || !*b {
		t.Errorf("migCapable = %v, want true on a MIG-capable GPU with MIG disabled", b)
	}
	if n, ok := intAttr(g, "numaNode"); !ok || n != 0 {
		t.Errorf("numaNode = %d %v", n, ok)
	}
	if q := g.Capacity["memory"].Value; q.Value() != nvmltest.H100MemoryBytes {
		t.Errorf("memory = %s", q.String())
	}
	last := devs["gpu-0000-db-00-0"]
	if _, ok := intAttr(last, "numaNode"); ok {
		t.Errorf("GPU on NUMA node -1 publishes numaNode %v", last.Attributes["numaNode"])
	}
	if _, ok := intAttr(last, "resource.kubernetes.io/numaNode"); ok {
		t.Errorf("GPU on NUMA node -1 publishes the standard NUMA attribute")
	}
}

// A GPU NVML reports that PCI discovery did not find is published without
// topology, with a notice naming it; a PCI GPU NVML does not know is not.
func TestGPUJoinMismatch(t *testing.T) {
	res := gpuNode(t, nvmltest.H100Node(), "0000:19:00.0", "0000:3b:00.0", "0000:ee:00.0")
	devs := devices(res)
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	g := devs["gpu-0000-4c-00-0"]
	if str(g, "resource.kubernetes.io/pcieRoot") != "" || str(g, "pciAddress") != "0000:4c:00.0" {
		t.Errorf("unjoined GPU attributes %v", g.Attributes)
	}
	notes := strings.Join(res.Notices, "\n")
	for _, want := range []string{"GPU 2 (" + nvmltest.H100UUID(2), "0000:ee:00.0 is not reported by NVML"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notices lack %q:\n%s", want, notes)
		}
	}
}

func TestGPUsWithoutNVML(t *testing.T) {
	tree := sysfstest.GPUNode(t.TempDir(), []string{"0000:19:00.0"}, func(int) int { return 0 })
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root,
		NVML: func(context.Context) (*nvmlinfo.Inventory, error) { return nil, context.DeadlineExceeded }})
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(inv, nodeconfig.Default(), "node-a")
	if len(devices(res)) != 0 || !strings.Contains(strings.Join(res.Notices, "\n"), "not published: context deadline exceeded") {
		t.Fatalf("devices %v notices %v", devices(res), res.Notices)
	}
}

// Persistence mode is published where NVML answered it, on a GPU and on its
// MIG devices; a GPU whose MIG instances or memory slices depend on the
// driver's state, with persistence off, is named in a notice. Where NVML
// did not answer, nothing is published.
func TestGPUPersistenceMode(t *testing.T) {
	on, off := true, false
	inv := nvmltest.H100Node(2)
	inv.Devices[0].PersistenceMode = &on
	inv.Devices[2].PersistenceMode = &off
	inv.Devices[3].PersistenceMode = &off
	res := gpuNode(t, inv)
	byUUID := map[string][]resourceapi.Device{}
	for _, e := range res.Index {
		if e.GPU != nil {
			byUUID[e.GPU.Device.UUID] = append(byUUID[e.GPU.Device.UUID], e.Device)
		}
	}
	for i, want := range map[int]*bool{0: &on, 1: nil, 2: &off, 3: &off} {
		devs := byUUID[nvmltest.H100UUID(i)]
		if len(devs) == 0 {
			t.Fatalf("GPU %d: no devices", i)
		}
		for _, d := range devs {
			got := d.Attributes["persistenceMode"].BoolValue
			if (got == nil) != (want == nil) || (got != nil && *got != *want) {
				t.Errorf("GPU %d device %s: persistenceMode %v, want %v", i, d.Name, got, want)
			}
		}
	}
	notes := strings.Join(res.Notices, "\n")
	if !strings.Contains(notes, nvmltest.H100UUID(2)+"): persistence mode is off") {
		t.Errorf("notices lack GPU 2's (MIG on) persistence mode:\n%s", notes)
	}
	if strings.Contains(notes, nvmltest.H100UUID(3)+"): persistence mode") {
		t.Errorf("a whole GPU (MIG off, no memory slices) was noticed for its persistence mode:\n%s", notes)
	}
}

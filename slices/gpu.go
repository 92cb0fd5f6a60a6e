package slices

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// GPU is what a published GPU or MIG device came from.
type GPU struct {
	Device nvmlinfo.Device
	// PCI is nil for a GPU NVML reports that PCI discovery did not find.
	PCI *discovery.PCIFunction
	// MIG is set for a MIG device: the profile and its placement.
	MIG *MIG
	// CounterSet is the parent GPU's counter set (MIG devices only).
	CounterSet    string
	DriverVersion string
	// Memory is how the GPU's memory slices are enforced (kind gpu).
	Memory discovery.GPUMemory
}

// MIG is one GPU-instance placement.
type MIG struct {
	Profile   nvmlinfo.MIGProfile
	Placement nvmlinfo.Placement
}

// gpus publishes what NVML confirms: a whole GPU where MIG is off, every
// placement NVML reports where it is on, with one counter set per such GPU.
func (b *builder) gpus(inv *discovery.Inventory) ([]Entry, []resourceapi.CounterSet) {
	if inv.NVML == nil {
		if len(inv.GPUs) > 0 {
			reason := "NVML was not asked"
			if inv.NVMLError != "" {
				reason = inv.NVMLError
			}
			b.notef("%d NVIDIA GPU PCI function(s) found but not published: %s", len(inv.GPUs), reason)
		}
		return nil, nil
	}
	for _, u := range inv.NVML.Unread {
		b.notef("NVML: %s; left out, the other GPUs published", u)
	}
	byAddr := map[string]*discovery.PCIFunction{}
	for i := range inv.GPUs {
		byAddr[inv.GPUs[i].Address] = &inv.GPUs[i].PCIFunction
	}
	var entries []Entry
	var sets []resourceapi.CounterSet
	seen := map[string]bool{}
	for _, d := range inv.NVML.Devices {
		g := GPU{Device: d, DriverVersion: inv.NVML.DriverVersion, Memory: inv.GPUMemory[d.UUID]}
		if g.Memory.Enforcement == "" {
			g.Memory = discovery.GPUMemory{Enforcement: "none", Reason: "no enforcement was detected for it"}
		}
		addr, err := nvmlinfo.NormalizeBusID(d.PCIBusID)
		if err == nil {
			g.PCI = byAddr[addr]
			seen[addr] = true
		}
		if g.PCI == nil {
			b.notef("GPU %d (%s, PCI bus ID %q) is reported by NVML but not among the PCI functions discovery found; published without topology attributes", d.Index, d.UUID, d.PCIBusID)
		}
		name := gpuName(d, addr, err)
		if p := d.PersistenceMode; p != nil && !*p && (d.MIGEnabled || g.Memory.Enforcement != "none") {
			// Without it the driver tears the GPU's state down whenever
			// no process holds it: the agent's restart with no claim
			// running is such a moment.
			b.notef("GPU %s (%s): persistence mode is off; the driver may drop its MIG instances and compute mode while no process holds it (run nvidia-persistenced)", name, d.UUID)
		}
		if !d.MIGEnabled {
			entries = append(entries, Entry{Kind: names.KindGPU, Device: b.wholeGPU(name, g, inv.NVML), GPU: &g})
			continue
		}
		migs, set := b.migs(name, g, inv.NVML)
		entries = append(entries, migs...)
		if set != nil {
			sets = append(sets, *set)
		}
	}
	for _, f := range inv.GPUs {
		if !seen[f.Address] {
			b.notef("NVIDIA GPU PCI function %s is not reported by NVML; not published", f.Address)
		}
	}
	return entries, sets
}

// gpuName names a GPU by its PCI address, as other PCI devices are.
func gpuName(d nvmlinfo.Device, addr string, addrErr error) string {
	if addrErr != nil {
		return fmt.Sprintf("%s-minor-%d", names.KindGPU, d.Minor)
	}
	return pciName(names.KindGPU, addr)
}

func (b *builder) wholeGPU(name string, g GPU, inv *nvmlinfo.Inventory) resourceapi.Device {
	d := newDevice(names.KindGPU, name)
	setGPUAttributes(d, g, inv)
	setString(d, names.AttrUUID, g.Device.UUID)
	setBool(d, names.AttrMIGCapable, g.Device.MIGCapable)
	setString(d, names.AttrMemoryEnforcement, g.Memory.Enforcement)
	shareable := b.gpuShareable(name, g)
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		names.CapMemory: b.capacity(names.KindGPU, names.CapMemory, *resource.NewQuantity(int64(g.Device.MemoryTotalBytes), resource.BinarySI), shareable, nodeconfig.Policy{}),
	}
	if shareable {
		d.AllowMultipleAllocations = ptr.To(true)
	}
	return *d
}

// gpuShareable reports whether a GPU is offered in memory slices: its
// slices can be enforced, and the node config gives a memory request
// policy for GPUs. Otherwise it is whole-device only, and the notice says
// why.
func (b *builder) gpuShareable(name string, g GPU) bool {
	if g.Memory.Enforcement == "none" {
		b.notef("GPU %s (%s): memory slices cannot be enforced (%s); whole-device only", name, g.Device.UUID, g.Memory.Reason)
		return false
	}
	if _, ok := b.cfg.Policy(names.KindGPU, names.CapMemory); !ok {
		b.notef("GPU %s (%s) could be shared in memory slices (%s) but the node config has no requestPolicies.gpu.memory; whole-device only", name, g.Device.UUID, g.Memory.Enforcement)
		return false
	}
	return true
}

// setGPUAttributes sets what a GPU and its MIG devices share: the PCI
// topology, so that a claim can match a GPU and a NIC on one PCIe root, and
// what NVML says of the card and driver.
func setGPUAttributes(d *resourceapi.Device, g GPU, inv *nvmlinfo.Inventory) {
	if g.PCI != nil {
		setPCI(d, *g.PCI)
	} else if addr, err := nvmlinfo.NormalizeBusID(g.Device.PCIBusID); err == nil {
		setString(d, names.AttrPCIAddress, addr)
	}
	setString(d, names.AttrProductName, g.Device.Name)
	setString(d, names.AttrArchitecture, g.Device.Architecture)
	if g.Device.ComputeCapability != "" {
		setVersion(d, names.AttrCUDAComputeCapability, g.Device.ComputeCapability+".0")
	}
	setString(d, names.AttrDriverVersion, inv.DriverVersion)
	if p := g.Device.PersistenceMode; p != nil {
		setBool(d, names.AttrPersistenceMode, *p)
	}
	if v := inv.CUDADriverVersion; v > 0 {
		setVersion(d, names.AttrCUDADriverVersion, fmt.Sprintf("%d.%d.0", v/1000, v%1000/10))
	}
}

func setVersion(d *resourceapi.Device, name resourceapi.QualifiedName, v string) {
	d.Attributes[name] = resourceapi.DeviceAttribute{VersionValue: &v}
}

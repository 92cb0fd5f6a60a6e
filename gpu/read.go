package gpu

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// nvmlError names the call that failed and NVML's reason.
func nvmlError(what string, ret nvml.Return) error {
	return fmt.Errorf("NVML %s: %s (%d)", what, nvml.ErrorString(ret), int32(ret))
}

// Read asks an initialised NVML for every GPU, its MIG mode and, where it is
// MIG capable, every GPU-instance profile with its possible placements.
// NVML answers the profile questions with MIG disabled too. Only the
// library's own questions fail the read: a GPU that cannot be read (lost,
// held in reset, XID 79) is left out, and a MIG profile NVML will not
// answer (a sandboxed driver's NO_PERMISSION) is left out of its GPU, each
// said in inv.Unread. Failing the whole read for one GPU published none at
// the next rescan.
func Read(lib Library) (*nvmlinfo.Inventory, error) {
	inv := &nvmlinfo.Inventory{}
	var ret nvml.Return
	if inv.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return nil, nvmlError("system driver version", ret)
	}
	if inv.CUDADriverVersion, ret = lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS {
		return nil, nvmlError("CUDA driver version", ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("device count", ret)
	}
	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			inv.Unread = append(inv.Unread, nvmlError(fmt.Sprintf("device %d handle", i), ret).Error())
			continue
		}
		d, err := readDevice(lib, dev, i, &inv.Unread)
		if err != nil {
			inv.Unread = append(inv.Unread, err.Error())
			continue
		}
		inv.Devices = append(inv.Devices, d)
	}
	return inv, nil
}

func readDevice(lib Library, dev nvml.Device, index int, unread *[]string) (nvmlinfo.Device, error) {
	d := nvmlinfo.Device{Index: index}
	fail := func(what string, ret nvml.Return) (nvmlinfo.Device, error) {
		if d.UUID != "" {
			what = fmt.Sprintf("(%s) %s", d.UUID, what)
		}
		return nvmlinfo.Device{}, nvmlError(fmt.Sprintf("device %d %s", index, what), ret)
	}
	var ret nvml.Return
	if d.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return fail("UUID", ret)
	}
	if d.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return fail("name", ret)
	}
	if d.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return fail("minor number", ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("PCI info", ret)
	}
	d.PCIBusID = cString(pci.BusId[:])
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("memory info", ret)
	}
	d.MemoryTotalBytes = mem.Total
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return fail("architecture", ret)
	}
	d.Architecture = ArchitectureName(arch)
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return fail("CUDA compute capability", ret)
	}
	d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	// Persistence mode keeps the driver's state while no process holds
	// the GPU; a GPU without it loses it between clients. Not knowing it
	// is no reason to leave the GPU out.
	if mode, ret := dev.GetPersistenceMode(); ret == nvml.SUCCESS {
		on := mode == nvml.FEATURE_ENABLED
		d.PersistenceMode = &on
	}
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		d.MIGCapable, d.MIGEnabled = true, current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
		return d, nil
	default:
		return fail("MIG mode", ret)
	}
	profiles, skipped := readProfiles(lib, dev, d.MemoryTotalBytes)
	for _, err := range skipped {
		*unread = append(*unread, fmt.Sprintf("device %d (%s): %v; that profile is not published", index, d.UUID, err))
	}
	d.MIGProfiles = profiles
	if d.MIGEnabled {
		d.Instances = readInstances(dev, profiles)
	}
	return d, nil
}

// readInstances lists the GPU instances that exist on a MIG-enabled device,
// by profile (asked by its index, recorded by its Id), in placement order.
// A profile whose instances cannot be listed is skipped: what is unknown is
// not published as taken.
func readInstances(dev nvml.Device, profiles []nvmlinfo.MIGProfile) []nvmlinfo.MIGInstance {
	var out []nvmlinfo.MIGInstance
	for _, p := range profiles {
		info, ret := dev.GetGpuInstanceProfileInfo(p.ProfileIndex)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			if gii, ret := gi.GetInfo(); ret == nvml.SUCCESS {
				out = append(out, nvmlinfo.MIGInstance{ProfileID: int(info.Id), Start: int(gii.Placement.Start), Size: int(gii.Placement.Size)})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// readProfiles lists the GPU-instance profiles the device supports, with
// NVML's placements: never a built-in table. It walks NVML's profile
// indices and records each profile's Id beside its index: placements are
// asked by the Id the index's info carries. A profile NVML answers
// otherwise than with its info or "not supported" is left out, and said.
func readProfiles(lib Library, dev nvml.Device, totalMemory uint64) (profiles []nvmlinfo.MIGProfile, skipped []error) {
	profiles = []nvmlinfo.MIGProfile{}
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			skipped = append(skipped, nvmlError(fmt.Sprintf("GPU instance profile index %d", index), ret))
			continue
		}
		if info.InstanceCount == 0 {
			continue
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			skipped = append(skipped, nvmlError(fmt.Sprintf("placements of GPU instance profile index %d (Id %d)", index, info.Id), ret))
			continue
		}
		p := nvmlinfo.MIGProfile{
			ProfileIndex: index, ProfileID: int(info.Id),
			SliceCount: int(info.SliceCount), InstanceCount: int(info.InstanceCount),
			MemorySizeMB: info.MemorySizeMB, MultiprocessorCount: int(info.MultiprocessorCount),
			Placements: make([]nvmlinfo.Placement, 0, len(placements)),
			Engines: &nvmlinfo.Engines{CopyEngines: int(info.CopyEngineCount), Decoders: int(info.DecoderCount),
				Encoders: int(info.EncoderCount), JPEGs: int(info.JpegCount), OFAs: int(info.OfaCount)},
		}
		name, ok := "", false
		if lib.ProfileName != nil {
			name, ok = lib.ProfileName(dev, index)
		}
		if !ok {
			name = ProfileName(index, p.SliceCount, p.MemorySizeMB, totalMemory)
		}
		p.Name = name
		for _, pl := range placements {
			p.Placements = append(p.Placements, nvmlinfo.Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		sort.Slice(p.Placements, func(i, j int) bool { return p.Placements[i].Start < p.Placements[j].Start })
		profiles = append(profiles, p)
	}
	return profiles, skipped
}

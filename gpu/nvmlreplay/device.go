package nvmlreplay

import (
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// device makes a mock device answer as the file says: identity, exact
// memory, the PCI bus ID (the mock's is empty), MIG mode, profiles asked by
// NVML's index answering their Id, and a GPU instance refused where it
// would overlap one that exists or exceed its profile's instance count, as
// the driver refuses it.
func (r *Replay) device(m *server.Device, d nvmlinfo.Device) {
	m.UUID, m.Minor, m.Index, m.PciBusID = d.UUID, d.Minor, d.Index, d.PCIBusID
	m.MemoryInfo = nvml.Memory{Total: d.MemoryTotalBytes, Free: d.MemoryTotalBytes}
	if d.MIGEnabled {
		m.MigMode = nvml.DEVICE_MIG_ENABLE
	}
	deviceID := m.Config.PciDeviceId
	m.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{PciDeviceId: deviceID}
		copyCString(p.BusId[:], d.PCIBusID)
		copyCString(p.BusIdLegacy[:], d.PCIBusID)
		return p, nvml.SUCCESS
	}
	m.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	// Persistence mode as the file says; a file that does not say has no
	// answer.
	m.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
		switch {
		case d.PersistenceMode == nil:
			return 0, nvml.ERROR_NOT_SUPPORTED
		case *d.PersistenceMode:
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		default:
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
	}
	// Compute mode Default, as a card comes up; a set one is kept (the
	// mock has none, and a GPU memory share sets and restores it).
	var modeMu sync.Mutex
	mode := nvml.COMPUTEMODE_DEFAULT
	m.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		modeMu.Lock()
		defer modeMu.Unlock()
		return mode, nvml.SUCCESS
	}
	m.SetComputeModeFunc = func(c nvml.ComputeMode) nvml.Return {
		if c < nvml.COMPUTEMODE_DEFAULT || c >= nvml.COMPUTEMODE_COUNT {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		modeMu.Lock()
		defer modeMu.Unlock()
		mode = c
		return nvml.SUCCESS
	}
	// No processes, unless ProcessesFrom names a file of them.
	m.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	m.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	if !d.MIGCapable {
		m.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
		m.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return
	}
	migDevices(m)
	if d.MIGProfiles != nil {
		byIndex := map[int]nvml.GpuInstanceProfileInfo{}
		for _, p := range d.MIGProfiles {
			byIndex[p.ProfileIndex] = profileInfo(p)
		}
		// The mock answers an index with the profile keyed by it; a real
		// card answers the index with a profile whose Id differs.
		m.GetGpuInstanceProfileInfoFunc = func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			info, ok := byIndex[index]
			if !ok {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return info, nvml.SUCCESS
		}
	}
	create := m.CreateGpuInstanceWithPlacementFunc
	m.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if mode, _, _ := m.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !possible(m.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)], *pl) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		known, ok := m.Config.MIGProfiles.GpuInstanceProfiles[int(info.Id)]
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		m.RLock()
		same := 0
		for gi := range m.GpuInstances {
			if overlaps(gi.Info.Placement, *pl) {
				m.RUnlock()
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			if gi.Info.ProfileId == info.Id {
				same++
			}
		}
		m.RUnlock()
		if uint32(same) >= known.InstanceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		return create(info, pl)
	}
}

func possible(placements []nvml.GpuInstancePlacement, p nvml.GpuInstancePlacement) bool {
	for _, q := range placements {
		if q == p {
			return true
		}
	}
	return false
}

func overlaps(a, b nvml.GpuInstancePlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

package nvmlreplay

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
)

// Replay is a mock NVML that answers as the inventory says.
type Replay struct {
	Server *server.Server
	// Warnings say where the replay departs from the file: a device whose
	// MIG profiles come from the mock's table.
	Warnings []string
	// names are the file's profile names by GPU UUID and profile index.
	names map[string]map[int]string
	// events are the file's events, from when it was loaded.
	events *events
}

// Load reads a replay file (strictly: see nvmlinfo.Decode).
func Load(path string) (*Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("NVML replay: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	inv, err := nvmlinfo.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("NVML replay %s: %w", path, err)
	}
	return New(inv)
}

// New builds the mock server. A device without migProfiles takes the mock's
// table for its product, with a warning; a MIG-capable device of a product
// the mock does not know gets no profiles. Profiles the file gives without
// their index (files written before carve recorded it) get it derived, with
// a warning where that was a guess; the caller's inventory is not changed.
func New(inv *nvmlinfo.Inventory) (*Replay, error) {
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	devs := append([]nvmlinfo.Device(nil), inv.Devices...)
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	r := &Replay{names: map[string]map[int]string{}}
	configs := make([]gpus.Config, len(devs))
	for i := range devs {
		if devs[i].MIGProfiles != nil {
			devs[i].MIGProfiles = append([]nvmlinfo.MIGProfile(nil), devs[i].MIGProfiles...)
			r.Warnings = append(r.Warnings, gpu.DeriveProfileIndices(&devs[i])...)
			r.guessEngines(&devs[i])
		}
		if err := checkIndices(devs[i]); err != nil {
			return nil, fmt.Errorf("NVML replay device %d (%s): %w", devs[i].Index, devs[i].UUID, err)
		}
	}
	for i, d := range devs {
		cfg, err := r.config(d)
		if err != nil {
			return nil, fmt.Errorf("NVML replay device %d (%s): %w", d.Index, d.UUID, err)
		}
		configs[i] = cfg
	}
	r.Server = server.NewServerWithGPUs(inv.DriverVersion, "replay", inv.CUDADriverVersion, configs...)
	r.events = newEvents(time.Now(), inv.Events)
	r.Server.EventSetCreateFunc = r.events.newSet
	for i, d := range devs {
		r.device(r.Server.Devices[i].(*server.Device), d)
		m := r.Server.Devices[i].(*server.Device)
		r570 := driverMajor(inv.DriverVersion) >= 570
		r.events.device(m, d.UUID, r570)
		m.GetFieldValuesFunc = r.events.fieldValues(d.UUID, r570)
	}
	for i, d := range devs {
		m := r.Server.Devices[i].(*server.Device)
		for j, in := range d.Instances {
			info, ok := m.Config.MIGProfiles.GpuInstanceProfiles[in.ProfileID]
			if !ok {
				return nil, fmt.Errorf("NVML replay device %d (%s): instances[%d]: no profile with Id %d", d.Index, d.UUID, j, in.ProfileID)
			}
			pl := nvml.GpuInstancePlacement{Start: uint32(in.Start), Size: uint32(in.Size)}
			if _, ret := m.CreateGpuInstanceWithPlacement(&info, &pl); ret != nvml.SUCCESS {
				return nil, fmt.Errorf("NVML replay device %d (%s): instances[%d] (profile Id %d at %d+%d): %s", d.Index, d.UUID, j, in.ProfileID, in.Start, in.Size, nvml.ErrorString(ret))
			}
		}
	}
	return r, nil
}

// Library is the replay as carve's NVML: profile names come from the file.
func (r *Replay) Library() gpu.Library {
	return gpu.Library{Interface: r.Server, ProfileName: r.profileName}
}

func (r *Replay) profileName(dev nvml.Device, index int) (string, bool) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return "", false
	}
	name, ok := r.names[uuid][index]
	return name, ok
}

// guessEngines gives the media-extension profiles of a file written before
// carve recorded engine counts the GPU's one optical-flow accelerator, as
// an A100's and an H100's hold it, so that the counters still refuse two of
// them at once.
func (r *Replay) guessEngines(d *nvmlinfo.Device) {
	guessed := false
	for j := range d.MIGProfiles {
		p := &d.MIGProfiles[j]
		if p.Engines == nil && gpu.MediaExtensionIndex(p.ProfileIndex) {
			p.Engines = &nvmlinfo.Engines{OFAs: 1}
			guessed = true
		}
	}
	if guessed {
		r.Warnings = append(r.Warnings, fmt.Sprintf("GPU %d (%s): no engine counts in the replay file; its media-extension profiles are taken to hold the GPU's one OFA", d.Index, d.UUID))
	}
}

// checkIndices refuses a device whose profiles share an index or an Id:
// NVML answers one profile for each.
func checkIndices(d nvmlinfo.Device) error {
	index, id := map[int]bool{}, map[int]bool{}
	for _, p := range d.MIGProfiles {
		if index[p.ProfileIndex] || id[p.ProfileID] {
			return fmt.Errorf("two MIG profiles with index %d or Id %d", p.ProfileIndex, p.ProfileID)
		}
		if p.ProfileIndex >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return fmt.Errorf("MIG profile %q: index %d is not one go-nvml knows (< %d)", p.Name, p.ProfileIndex, nvml.GPU_INSTANCE_PROFILE_COUNT)
		}
		index[p.ProfileIndex], id[p.ProfileID] = true, true
	}
	return nil
}

func (r *Replay) config(d nvmlinfo.Device) (gpus.Config, error) {
	arch, err := gpu.ParseArchitecture(d.Architecture)
	if err != nil {
		return gpus.Config{}, err
	}
	cfg := gpus.Config{Name: d.Name, Architecture: arch, Brand: nvml.BRAND_NVIDIA, MemoryMB: d.MemoryTotalBytes >> 20}
	if d.ComputeCapability != "" {
		major, minor, _ := strings.Cut(d.ComputeCapability, ".")
		cfg.CudaMajor, _ = strconv.Atoi(major)
		cfg.CudaMinor, _ = strconv.Atoi(minor)
	}
	switch {
	case !d.MIGCapable:
	case d.MIGProfiles != nil:
		cfg.MIGProfiles = profilesFromFile(d.MIGProfiles)
		r.names[d.UUID] = map[int]string{}
		for _, p := range d.MIGProfiles {
			r.names[d.UUID][p.ProfileIndex] = p.Name
		}
	default:
		table, ok := mockTable(d.Name)
		if !ok {
			r.Warnings = append(r.Warnings, fmt.Sprintf("GPU %d (%s, %s): no migProfiles in the replay file and go-nvml's mock has no table for this product; no MIG devices", d.Index, d.UUID, d.Name))
			break
		}
		r.Warnings = append(r.Warnings, fmt.Sprintf("GPU %d (%s, %s): no migProfiles in the replay file; using go-nvml's mock table for this product, which is not what a real card reports", d.Index, d.UUID, d.Name))
		cfg.MIGProfiles = table
	}
	return cfg, nil
}

// mockTable finds the go-nvml mock's MIG table for a product name.
func mockTable(name string) (gpus.MIGProfileConfig, bool) {
	for _, c := range []gpus.Config{gpus.H100_SXM5_80GB, gpus.H200_SXM5_141GB, gpus.B200_SXM5_180GB,
		gpus.A100_SXM4_40GB, gpus.A100_SXM4_80GB, gpus.A100_PCIE_40GB, gpus.A100_PCIE_80GB, gpus.A30_PCIE_24GB} {
		if strings.TrimPrefix(c.Name, "Mock ") == strings.TrimPrefix(name, "Mock ") {
			return c.MIGProfiles, true
		}
	}
	return gpus.MIGProfileConfig{}, false
}

// profilesFromFile is the mock's table for the file's profiles, each with the
// one compute-instance profile that fills it. The mock looks placements,
// instances and compute instances up by the profile's Id, so every map is
// keyed by Id; answering a profile index is the device's own function (see
// device), since on a real card index and Id differ.
func profilesFromFile(profiles []nvmlinfo.MIGProfile) gpus.MIGProfileConfig {
	cfg := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
		ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
		ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
	}
	for _, p := range profiles {
		cfg.GpuInstanceProfiles[p.ProfileID] = profileInfo(p)
		for _, pl := range p.Placements {
			cfg.GpuInstancePlacements[p.ProfileID] = append(cfg.GpuInstancePlacements[p.ProfileID],
				nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		if ci, ok := gpu.ComputeProfileBySlices[p.SliceCount]; ok {
			cfg.ComputeInstanceProfiles[p.ProfileID] = map[int]nvml.ComputeInstanceProfileInfo{ci: {
				Id: uint32(ci), SliceCount: uint32(p.SliceCount), InstanceCount: 1, MultiprocessorCount: uint32(p.MultiprocessorCount),
			}}
			cfg.ComputeInstancePlacements[p.ProfileID] = map[int][]nvml.ComputeInstancePlacement{ci: {{Start: 0, Size: uint32(p.SliceCount)}}}
		}
	}
	return cfg
}

// profileInfo is NVML's answer for the profile: its Id, not its index.
func profileInfo(p nvmlinfo.MIGProfile) nvml.GpuInstanceProfileInfo {
	info := nvml.GpuInstanceProfileInfo{
		Id: uint32(p.ProfileID), SliceCount: uint32(p.SliceCount), InstanceCount: uint32(p.InstanceCount),
		MultiprocessorCount: uint32(p.MultiprocessorCount), MemorySizeMB: p.MemorySizeMB,
	}
	if e := p.Engines; e != nil {
		info.CopyEngineCount, info.DecoderCount, info.EncoderCount = uint32(e.CopyEngines), uint32(e.Decoders), uint32(e.Encoders)
		info.JpegCount, info.OfaCount = uint32(e.JPEGs), uint32(e.OFAs)
	}
	return info
}

// driverMajor is a driver version's branch ("580.159.04": 580); 0 where
// the version does not say.
func driverMajor(version string) int {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0
	}
	return n
}

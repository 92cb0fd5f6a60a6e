package nvmlreplay

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlinfo"
)

// Replay is a mock NVML that answers as the inventory says.
type Replay struct {
	Server *server.Server
	// Warnings say where the replay departs from the file: a device whose
	// MIG profiles come from the mock's table.
	Warnings []string
	names    map[string]map[uint32]string
}

// Load reads a replay file (strictly: see nvmlinfo.Decode).
func Load(path string) (*Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("NVML replay: %w", err)
	}
	defer f.Close()
	inv, err := nvmlinfo.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("NVML replay %s: %w", path, err)
	}
	return New(inv)
}

// New builds the mock server. A device without migProfiles takes the mock's
// table for its product, with a warning; a MIG-capable device of a product
// the mock does not know gets no profiles.
func New(inv *nvmlinfo.Inventory) (*Replay, error) {
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	devs := append([]nvmlinfo.Device(nil), inv.Devices...)
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	r := &Replay{names: map[string]map[uint32]string{}}
	configs := make([]gpus.Config, len(devs))
	for i, d := range devs {
		cfg, err := r.config(d)
		if err != nil {
			return nil, fmt.Errorf("NVML replay device %d (%s): %w", d.Index, d.UUID, err)
		}
		configs[i] = cfg
	}
	r.Server = server.NewServerWithGPUs(inv.DriverVersion, "replay", inv.CUDADriverVersion, configs...)
	for i, d := range devs {
		r.device(r.Server.Devices[i].(*server.Device), d)
	}
	return r, nil
}

// Library is the replay as carve's NVML: profile names come from the file.
func (r *Replay) Library() gpu.Library {
	return gpu.Library{Interface: r.Server, ProfileName: r.profileName}
}

func (r *Replay) profileName(dev nvml.Device, info nvml.GpuInstanceProfileInfo) (string, bool) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return "", false
	}
	name, ok := r.names[uuid][info.Id]
	return name, ok
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
		r.names[d.UUID] = map[uint32]string{}
		for _, p := range d.MIGProfiles {
			r.names[d.UUID][uint32(p.ProfileID)] = p.Name
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

// computeProfileBySlices is the compute-instance profile that fills a GPU
// instance of that many slices.
var computeProfileBySlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// profilesFromFile is the mock's table for the file's profiles, each with the
// one compute-instance profile that fills it.
func profilesFromFile(profiles []nvmlinfo.MIGProfile) gpus.MIGProfileConfig {
	cfg := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
		ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
		ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
	}
	for _, p := range profiles {
		cfg.GpuInstanceProfiles[p.ProfileID] = nvml.GpuInstanceProfileInfo{
			Id: uint32(p.ProfileID), SliceCount: uint32(p.SliceCount), InstanceCount: uint32(p.InstanceCount),
			MultiprocessorCount: uint32(p.MultiprocessorCount), MemorySizeMB: p.MemorySizeMB,
		}
		for _, pl := range p.Placements {
			cfg.GpuInstancePlacements[p.ProfileID] = append(cfg.GpuInstancePlacements[p.ProfileID],
				nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		if ci, ok := computeProfileBySlices[p.SliceCount]; ok {
			cfg.ComputeInstanceProfiles[p.ProfileID] = map[int]nvml.ComputeInstanceProfileInfo{ci: {
				Id: uint32(ci), SliceCount: uint32(p.SliceCount), InstanceCount: 1, MultiprocessorCount: uint32(p.MultiprocessorCount),
			}}
			cfg.ComputeInstancePlacements[p.ProfileID] = map[int][]nvml.ComputeInstancePlacement{ci: {{Start: 0, Size: uint32(p.SliceCount)}}}
		}
	}
	return cfg
}

// Package nvmltest builds the NVML inventories of the GPU nodes carve's tests
// use: an 8 x H100 node shaped as a real H100 reports on driver 580, and an
// A100 node whose MIG profiles come from go-nvml's mock table.
package nvmltest

import (
	"fmt"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// H100MemoryBytes is what a real H100 80GB HBM3 reports as total memory.
const H100MemoryBytes = 85520809984

// H100Profiles is the profile table of a real H100 80GB HBM3 on driver 580
// as the field notes give it: placements span memory slices, 8 in
// all; 1g.20gb has 4 placements of span 2, 3g.40gb spans 4, 7g.80gb spans 8.
// It is not go-nvml's mock table, which gives 7 slices. Profile Ids equal
// the indices (NVML's GPU_INSTANCE_PROFILE_* values), as go-nvml's mock
// numbers them; the real card's Ids differ (see gpu/prep's testdata).
func H100Profiles() []nvmlinfo.MIGProfile {
	span := func(size int, starts ...int) []nvmlinfo.Placement {
		out := make([]nvmlinfo.Placement, len(starts))
		for i, s := range starts {
			out[i] = nvmlinfo.Placement{Start: s, Size: size}
		}
		return out
	}
	// engines are the card's counts (copy, decoder, encoder, JPEG, OFA).
	engines := func(ce, dec, enc, jpeg, ofa int) *nvmlinfo.Engines {
		return &nvmlinfo.Engines{CopyEngines: ce, Decoders: dec, Encoders: enc, JPEGs: jpeg, OFAs: ofa}
	}
	return []nvmlinfo.MIGProfile{
		{ProfileIndex: 0, ProfileID: 0, Name: "1g.10gb", SliceCount: 1, InstanceCount: 7, MemorySizeMB: 9984, MultiprocessorCount: 16, Engines: engines(1, 1, 0, 1, 0), Placements: span(1, 0, 1, 2, 3, 4, 5, 6)},
		{ProfileIndex: 1, ProfileID: 1, Name: "2g.20gb", SliceCount: 2, InstanceCount: 3, MemorySizeMB: 20096, MultiprocessorCount: 32, Engines: engines(2, 2, 0, 2, 0), Placements: span(2, 0, 2, 4)},
		{ProfileIndex: 2, ProfileID: 2, Name: "3g.40gb", SliceCount: 3, InstanceCount: 2, MemorySizeMB: 40448, MultiprocessorCount: 60, Engines: engines(3, 3, 0, 3, 0), Placements: span(4, 0, 4)},
		{ProfileIndex: 3, ProfileID: 3, Name: "4g.40gb", SliceCount: 4, InstanceCount: 1, MemorySizeMB: 40448, MultiprocessorCount: 64, Engines: engines(4, 4, 0, 4, 0), Placements: span(4, 0)},
		{ProfileIndex: 4, ProfileID: 4, Name: "7g.80gb", SliceCount: 7, InstanceCount: 1, MemorySizeMB: 80896, MultiprocessorCount: 132, Engines: engines(8, 7, 0, 7, 1), Placements: span(8, 0)},
		{ProfileIndex: 7, ProfileID: 7, Name: "1g.10gb+me", SliceCount: 1, InstanceCount: 1, MemorySizeMB: 9984, MultiprocessorCount: 16, Engines: engines(1, 1, 0, 1, 1), Placements: span(1, 0, 1, 2, 3, 4, 5, 6)},
		{ProfileIndex: 9, ProfileID: 9, Name: "1g.20gb", SliceCount: 1, InstanceCount: 4, MemorySizeMB: 19968, MultiprocessorCount: 26, Engines: engines(1, 1, 0, 1, 0), Placements: span(2, 0, 2, 4, 6)},
	}
}

// H100BusIDs are the NVML bus IDs of a DGX H100's eight GPUs.
var H100BusIDs = []string{"00000000:19:00.0", "00000000:3B:00.0", "00000000:4C:00.0", "00000000:5D:00.0",
	"00000000:9B:00.0", "00000000:BB:00.0", "00000000:CB:00.0", "00000000:DB:00.0"}

// H100UUID is the UUID of the DGX H100's GPU i.
func H100UUID(i int) string { return fmt.Sprintf("GPU-b1000000-0000-4000-8000-%012x", i) }

// H100Node is a DGX H100: eight GPUs, MIG enabled on those listed.
func H100Node(migEnabled ...int) *nvmlinfo.Inventory {
	inv := &nvmlinfo.Inventory{DriverVersion: "580.159.04", CUDADriverVersion: 13000}
	enabled := map[int]bool{}
	for _, i := range migEnabled {
		enabled[i] = true
	}
	for i, bus := range H100BusIDs {
		inv.Devices = append(inv.Devices, nvmlinfo.Device{
			Index: i, Minor: i, UUID: H100UUID(i), Name: "NVIDIA H100 80GB HBM3",
			PCIBusID: bus, MemoryTotalBytes: H100MemoryBytes, Architecture: "hopper", ComputeCapability: "9.0",
			MIGCapable: true, MIGEnabled: enabled[i], MIGProfiles: H100Profiles(),
		})
	}
	return inv
}

// A100Node is one A100-SXM4-40GB with MIG enabled and no migProfiles: a
// replay takes them from go-nvml's mock table, warning that it does.
func A100Node() *nvmlinfo.Inventory {
	return &nvmlinfo.Inventory{DriverVersion: "535.104.05", CUDADriverVersion: 12020, Devices: []nvmlinfo.Device{{
		Index: 0, Minor: 0, UUID: "GPU-a1000000-0000-4000-8000-000000000000", Name: "NVIDIA A100-SXM4-40GB",
		PCIBusID: "00000000:07:00.0", MemoryTotalBytes: 40 << 30, Architecture: "ampere", ComputeCapability: "8.0",
		MIGCapable: true, MIGEnabled: true,
	}}}
}

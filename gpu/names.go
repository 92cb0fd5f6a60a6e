package gpu

import (
	"fmt"
	"math"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Architecture names, as published in the "architecture" attribute.
var architectures = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER:    "kepler",
	nvml.DEVICE_ARCH_MAXWELL:   "maxwell",
	nvml.DEVICE_ARCH_PASCAL:    "pascal",
	nvml.DEVICE_ARCH_VOLTA:     "volta",
	nvml.DEVICE_ARCH_TURING:    "turing",
	nvml.DEVICE_ARCH_AMPERE:    "ampere",
	nvml.DEVICE_ARCH_ADA:       "ada",
	nvml.DEVICE_ARCH_HOPPER:    "hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
	nvml.DEVICE_ARCH_RUBIN:     "rubin",
}

// ArchitectureName is the lower-case name of an NVML architecture.
func ArchitectureName(a nvml.DeviceArchitecture) string {
	if n, ok := architectures[a]; ok {
		return n
	}
	return "unknown"
}

// ParseArchitecture is the inverse of ArchitectureName.
func ParseArchitecture(name string) (nvml.DeviceArchitecture, error) {
	for a, n := range architectures {
		if strings.EqualFold(n, name) {
			return a, nil
		}
	}
	return nvml.DEVICE_ARCH_UNKNOWN, fmt.Errorf("unknown GPU architecture %q", name)
}

// DerivedProfileName names a profile as NVIDIA does where the driver gives
// no name: "<slices>g.<GB>gb", the memory being the profile's share of the
// GPU rounded up to eighths, as go-nvlib computes it; "+me" marks the
// media-extension revisions.
func DerivedProfileName(info nvml.GpuInstanceProfileInfo, totalMemoryBytes uint64) string {
	const mib, gib = 1 << 20, 1 << 30
	gb := uint64(math.Round(float64(info.MemorySizeMB) / 1024))
	if totalMemoryBytes > 0 {
		frac := float64(info.MemorySizeMB*mib) / float64(totalMemoryBytes)
		frac = math.Ceil(frac*8) / 8
		gb = uint64(math.Round(frac * float64((totalMemoryBytes+gib-1)/gib)))
	}
	name := fmt.Sprintf("%dg.%dgb", info.SliceCount, gb)
	switch info.Id {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		name += "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		name += "+gfx"
	}
	return name
}

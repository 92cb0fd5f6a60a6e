package gpu

import (
	"fmt"
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

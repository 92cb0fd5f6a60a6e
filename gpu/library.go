package gpu

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Library is NVML as carve uses it: go-nvml's interface, backed by the real
// libnvidia-ml.so.1 or by go-nvml's mock (package nvmlreplay).
type Library struct {
	nvml.Interface
	// ProfileName, when set, gives NVML's name of the GPU-instance
	// profile at NVML's profile index ("3g.40gb"). Without it, or where it
	// reports false, the name is built as nvidia-smi builds it (see
	// ProfileName).
	ProfileName func(dev nvml.Device, index int) (string, bool)
}

// NVMLLibraryName is the library go-nvml dlopens.
const NVMLLibraryName = "libnvidia-ml.so.1"

// libDirs are where driver installs put their libraries below a driver root.
var libDirs = []string{"lib64", "lib", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib"}

// RealLibrary is the host's NVML. The library is looked for below
// driverRoot (e.g. /usr/local/nvidia/lib64) and, failing that, left to the
// dynamic loader's search path. Nothing is loaded until Init.
func RealLibrary(driverRoot string) Library {
	path := NVMLLibraryName
	if found := FindFile(driverRoot, libDirs, NVMLLibraryName); found != "" {
		path = found
	}
	lib := nvml.New(nvml.WithLibraryPath(path))
	return Library{Interface: lib, ProfileName: realProfileName}
}

// LibraryDirs are the directories below driverRoot that hold the driver's
// libcuda.so.1, as an LD_LIBRARY_PATH for what must load it from there (an
// MPS daemon and its servers); none for a driver at / or "", whose
// libraries the dynamic loader finds itself.
func LibraryDirs(driverRoot string) []string {
	if driverRoot == "" || filepath.Clean(driverRoot) == "/" {
		return nil
	}
	var out []string
	for _, d := range libDirs {
		if _, err := os.Stat(filepath.Join(driverRoot, d, "libcuda.so.1")); err == nil {
			out = append(out, filepath.Join(driverRoot, d))
		}
	}
	return out
}

// FindFile returns the first dir/name below root that exists, or "".
func FindFile(root string, dirs []string, name string) string {
	if root == "" {
		return ""
	}
	for _, d := range dirs {
		p := filepath.Join(root, d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// realProfileName asks the driver for the name of the profile at the index
// (the v3 profile info, which go-nvml's mock cannot answer). It takes the
// index, never the profile's Id: asked with the Id, an H100 names its
// 7g.80gb (Id 0) after index 0, 1g.10gb. With MIG disabled the driver's
// name is empty (driver 580 on an H100).
func realProfileName(dev nvml.Device, index int) (string, bool) {
	v3, ret := dev.GetGpuInstanceProfileInfoV(index).V3()
	if ret != nvml.SUCCESS {
		return "", false
	}
	name := cString(v3.Name[:])
	name = strings.TrimPrefix(name, "MIG ")
	return name, name != ""
}

// cString converts NVML's fixed, NUL-terminated char arrays.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

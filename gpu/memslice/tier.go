// Package memslice hands out and takes back memory slices of shared GPUs:
// it chooses each GPU's enforcement tier at start (dmem, mps-policed or
// none), prepares a share on that tier (the GPU's MPS control daemon and
// compute mode, the dmem hook, the pinned memory ceiling, policing),
// undoes it, recovers after a crash, and lists the node's GPU shares.
package memslice

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/dmem"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/nvmlinfo"
)

// Tier is how a GPU's memory slices are enforced: the values of the
// memoryEnforcement attribute, a contract.
type Tier string

const (
	// TierDMEM: the kernel's dmem cgroup controller holds the pod's
	// device memory (MPS v3 memory partitioning: driver r615, CUDA 13.4,
	// cgroup v2, CONFIG_CGROUP_DMEM).
	TierDMEM Tier = "dmem"
	// TierMPSPoliced: MPS v2's pinned memory ceiling per process, and a
	// policing loop per pod.
	TierMPSPoliced Tier = "mps-policed"
	// TierNone: slices cannot be enforced; the GPU is whole-device only.
	TierNone Tier = "none"
)

// Choice is a GPU's tier and why.
type Choice struct {
	Tier Tier
	// Reason says why no stronger tier was chosen.
	Reason string
	// Region is the GPU's dmem region (dmem only).
	Region string
}

// Facts are what the choice depends on.
type Facts struct {
	DriverVersion     string
	CUDADriverVersion int
	MIGEnabled        bool
	PCIAddress        string
	// Dmem is the cgroup root's dmem.capacity; DmemErr why it is absent.
	Dmem    map[string]uint64
	DmemErr error
	// MPSControl is nvidia-cuda-mps-control's path; empty where absent.
	MPSControl string
}

// The stack MPS v3 memory partitioning needs.
const (
	minDmemDriverMajor = 615
	minDmemCUDA        = 13040
)

// Choose picks the strongest tier the facts allow.
func Choose(f Facts) Choice {
	if f.MIGEnabled {
		return Choice{Tier: TierNone, Reason: "MIG is on: the GPU is partitioned by MIG"}
	}
	if f.MPSControl == "" {
		return Choice{Tier: TierNone, Reason: "no " + mps.Binary + " below the driver root"}
	}
	var why []string
	major, _ := strconv.Atoi(strings.SplitN(f.DriverVersion, ".", 2)[0])
	if major < minDmemDriverMajor {
		why = append(why, fmt.Sprintf("driver %s is older than r%d", f.DriverVersion, minDmemDriverMajor))
	}
	if f.CUDADriverVersion < minDmemCUDA {
		why = append(why, fmt.Sprintf("CUDA %d.%d is older than 13.4", f.CUDADriverVersion/1000, f.CUDADriverVersion%1000/10))
	}
	region, ok := dmem.RegionFor(f.Dmem, f.PCIAddress)
	switch {
	case f.DmemErr != nil:
		why = append(why, fmt.Sprintf("no dmem cgroup controller (%v)", f.DmemErr))
	case !ok:
		why = append(why, "dmem.capacity has no nvidia/"+f.PCIAddress+"/vidmem region")
	}
	if len(why) == 0 {
		return Choice{Tier: TierDMEM, Region: region}
	}
	return Choice{Tier: TierMPSPoliced, Reason: "no kernel limit: " + strings.Join(why, "; ")}
}

// Detect chooses every GPU's tier: the dmem regions under cgroupRoot (the
// host's cgroup v2 mount) and the MPS control binary below driverRoot.
func Detect(inv *nvmlinfo.Inventory, cgroupRoot, driverRoot string) map[string]Choice {
	out := map[string]Choice{}
	if inv == nil {
		return out
	}
	capacity, err := dmem.Capacity(cgroupRoot)
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%s/dmem.capacity absent: kernel without CONFIG_CGROUP_DMEM, or not cgroup v2", cgroupRoot)
	}
	control := gpu.FindFile(driverRoot, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary)
	for _, d := range inv.Devices {
		addr, aerr := nvmlinfo.NormalizeBusID(d.PCIBusID)
		if aerr != nil {
			addr = d.PCIBusID
		}
		out[d.UUID] = Choose(Facts{DriverVersion: inv.DriverVersion, CUDADriverVersion: inv.CUDADriverVersion,
			MIGEnabled: d.MIGEnabled, PCIAddress: addr, Dmem: capacity, DmemErr: err, MPSControl: control})
	}
	return out
}

package memslice

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/dmem"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/prepare/hook"
)

// Tier is how a GPU's memory slices are enforced: the values of the
// memoryEnforcement attribute, a contract.
type Tier string

const (
	// TierDMEM means the kernel's dmem cgroup controller holds the pod's
	// device memory (MPS v3 memory partitioning: driver r615, CUDA 13.4,
	// cgroup v2, CONFIG_CGROUP_DMEM).
	TierDMEM Tier = "dmem"
	// TierMPSPoliced means MPS v2's pinned memory ceiling per process, and a
	// policing loop per pod.
	TierMPSPoliced Tier = "mps-policed"
	// TierNone means slices cannot be enforced; the GPU is whole-device only.
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
	// HostPIDs says why this process does not see the host's PIDs; nil
	// where it does. Policing kills the processes NVML names by their
	// host PIDs, which a process in a PID namespace of its own (a pod
	// without hostPID) can neither map to pods nor kill.
	HostPIDs error
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
	if f.HostPIDs != nil {
		return Choice{Tier: TierNone, Reason: fmt.Sprintf("no kernel limit (%s), and no policing: %v", strings.Join(why, "; "), f.HostPIDs)}
	}
	return Choice{Tier: TierMPSPoliced, Reason: "no kernel limit: " + strings.Join(why, "; ")}
}

// Env is where Detect looks: the host as this process sees it.
type Env struct {
	// CgroupRoot is the host's cgroup v2 mount (its dmem.capacity).
	CgroupRoot string
	// DriverRoot is the NVIDIA driver root (nvidia-cuda-mps-control below
	// it).
	DriverRoot string
	// ProcRoot is the host's /proc: its init process's PID namespace is
	// the host's.
	ProcRoot string
}

// EnvBelow is the Env of a host mounted at root (the agent's --root) with
// its driver at driverRoot on that host.
func EnvBelow(root, driverRoot string) Env {
	if root == "" {
		root = "/"
	}
	return Env{CgroupRoot: filepath.Join(root, hook.DefaultCgroupRoot), DriverRoot: filepath.Join(root, driverRoot), ProcRoot: filepath.Join(root, "proc")}
}

// initPIDNamespace is the kernel's initial PID namespace as readlink of
// /proc/<pid>/ns/pid names it: its inode is fixed (PROC_PID_INIT_INO,
// include/linux/proc_ns.h).
const initPIDNamespace = "pid:[4026531836]"

// hostPIDs is nil where this process is in the PID namespace of the host's
// init process (<procRoot>/1). Where that link cannot be read (a sandbox
// that denies ptrace access to PID 1, as on the lent GPU machines), the
// kernel's initial PID namespace stands for the host's.
func hostPIDs(procRoot string) error {
	return hostPIDsWith(os.Readlink, procRoot)
}

func hostPIDsWith(readlink func(string) (string, error), procRoot string) error {
	own, err := readlink("/proc/self/ns/pid")
	if err != nil {
		return fmt.Errorf("this process's PID namespace: %w", err)
	}
	host, err := readlink(filepath.Join(procRoot, "1", "ns", "pid"))
	if errors.Is(err, fs.ErrPermission) {
		host, err = initPIDNamespace, nil
	}
	if err != nil {
		return fmt.Errorf("the host's PID namespace: %w", err)
	}
	if own != host {
		return fmt.Errorf("this process's PID namespace %s is not the host's %s (the agent's pod needs hostPID)", own, host)
	}
	return nil
}

// GPUMemory is the choice as discovery publishes it.
func (c Choice) GPUMemory() discovery.GPUMemory {
	return discovery.GPUMemory{Enforcement: string(c.Tier), Reason: c.Reason, Region: c.Region}
}

// Tiers is the inventory's GPUMemory: every GPU's tier as Detect chooses
// it. `carve discover` publishes it; the agent chooses once per GPU.
func Tiers(inv *nvmlinfo.Inventory, env Env) map[string]discovery.GPUMemory {
	out := map[string]discovery.GPUMemory{}
	for uuid, c := range Detect(inv, env) {
		out[uuid] = c.GPUMemory()
	}
	return out
}

// Detect chooses every GPU's tier from what env shows: the dmem regions,
// the MPS control binary, and whether this process sees the host's PIDs.
func Detect(inv *nvmlinfo.Inventory, env Env) map[string]Choice {
	out := map[string]Choice{}
	if inv == nil {
		return out
	}
	capacity, err := dmem.Capacity(env.CgroupRoot)
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%s/dmem.capacity absent: kernel without CONFIG_CGROUP_DMEM, or not cgroup v2", env.CgroupRoot)
	}
	control := gpu.FindFile(env.DriverRoot, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary)
	pids := hostPIDs(env.ProcRoot)
	for _, d := range inv.Devices {
		addr, aerr := nvmlinfo.NormalizeBusID(d.PCIBusID)
		if aerr != nil {
			addr = d.PCIBusID
		}
		out[d.UUID] = Choose(Facts{DriverVersion: inv.DriverVersion, CUDADriverVersion: inv.CUDADriverVersion,
			MIGEnabled: d.MIGEnabled, PCIAddress: addr, Dmem: capacity, DmemErr: err, MPSControl: control, HostPIDs: pids})
	}
	return out
}

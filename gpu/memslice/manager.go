package memslice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
)

// ContainerPipeRoot holds, in a share's container, the MPS pipe directory
// of each GPU it has a share of, at ContainerPipeRoot/<GPU UUID>: a
// container with shares of two GPUs sees both of its claim's daemons.
const ContainerPipeRoot = "/run/nvidia-mps"

// ContainerPipeDir is where a share's container sees the pipe directory of
// GPU uuid's daemon.
func ContainerPipeDir(uuid string) string { return ContainerPipeRoot + "/" + uuid }

// NVML is what the manager asks of the node's NVML (gpu.Session).
type NVML interface {
	Memory(ctx context.Context, uuid string) (nvml.Memory, error)
	ComputeMode(ctx context.Context, uuid string) (gpu.ComputeMode, error)
	SetComputeMode(ctx context.Context, uuid string, mode gpu.ComputeMode) error
}

// DefaultContextReserve is the agent's --mps-context-reserve: an H100 with
// driver 580 read 8802 MiB in NVML for a process holding 8 GiB (610 MiB
// beside it) and 516 MiB for one whose allocation MPS refused
// (gpu/acceptance/results/h100-2026-11-25.md), rounded up to 64 MiB steps.
// The acceptance's MPS probe measures it on the card it runs on.
const DefaultContextReserve = 640 << 20

// Options are what shares are made with.
type Options struct {
	NVML NVML
	// Dir holds one directory per shared GPU (its gpu.json, its dmem
	// shares' records) and, below Dir/mps, one per claim (its tmpfs) with
	// one per GPU of the claim (its MPS daemon's pipe and log
	// directories): <state-dir>/gpushare. See DaemonDir.
	Dir string
	// MPSControl is the nvidia-cuda-mps-control binary.
	MPSControl string
	// DriverLibDirs are the driver's library directories, the daemons'
	// LD_LIBRARY_PATH (gpu.LibraryDirs); none for a driver at /.
	DriverLibDirs []string
	// DaemonEnv are more variables for every daemon (mps.Daemon.Env);
	// none in the agent.
	DaemonEnv []string
	// DaemonCapabilities are the only capabilities every daemon keeps
	// (mps.Daemon.Capabilities); nil keeps all.
	DaemonCapabilities mps.Capabilities
	// ContextReserve is the part of an mps-policed slice a CUDA process's
	// context takes (--mps-context-reserve): NVML's figure for a process,
	// which policing holds to the slice, counts its context, and MPS's
	// ceiling counts its allocations; the ceiling is the slice less this,
	// so that a process MPS lets allocate is never over its slice in
	// NVML's eyes. 0 sets the ceiling at the slice.
	ContextReserve uint64
	// HookPath and HookArgs run `carve hook dmem-limit` (dmem tier).
	HookPath string
	HookArgs []string
	// CgroupRoot is the host's cgroup v2 mount, as the hook sees it.
	CgroupRoot string
	// ShmDir is where CheckShm mounts a probe tmpfs, to learn at start
	// whether the claims' tmpfs mounts will show on the host;
	// <Dir>/../mps-shm when empty. It must be a host path, as Dir is.
	ShmDir string
	// ShmSize bounds each claim's tmpfs (the --mps-shm-size default: the
	// claim config API has no GPU config to size it from);
	// mps.DefaultShmSize when 0.
	ShmSize uint64
	// HostRoot, when set, is where this process sees the host's root (the
	// runtime's root, the host root mount). A share is refused unless its
	// claim's tmpfs shows below it too: containers are given the host's
	// view, which has the tmpfs only where the mount of the state
	// directory propagates to the host.
	HostRoot string
	// Start starts each MPS daemon (mps.Daemon.Start); nil starts it from
	// this process's mount namespace.
	Start mps.Starter
	// Keeper holds each MPS daemon apart from the agent's container, so
	// that it outlives the agent's pod (mps.Daemon.Keep); nil leaves
	// daemons where they start.
	Keeper mps.Keeper
	// Police holds mps-policed shares to their slices; nil refuses them.
	Police *police.Police
	// Policing, when set, says why the policing loop cannot read a GPU
	// (its NVML lane wedged), nil where it can: a new mps-policed share
	// of a GPU it cannot read is refused until it can.
	Policing func(uuid string) error
	// KeepComputeMode leaves the GPU's compute mode alone (the
	// acceptance run on a lent machine). Shares need mode Default (a daemon
	// per claim, and EXCLUSIVE_PROCESS admits one MPS server per GPU):
	// under a kept EXCLUSIVE_PROCESS or PROHIBITED, a second claim's
	// clients on the GPU wait or fail.
	KeepComputeMode bool
	Logger          logr.Logger
}

// Request is one share to prepare.
type Request struct {
	// Key is the allocation's ShareKey.
	Key       string
	ClaimUID  types.UID
	Namespace string
	Name      string
	ShareID   string
	UUID      string
	Slice     uint64
	Choice    Choice
	// EnvPrefix is the allocation's CARVE_<REQUEST>_.
	EnvPrefix string
	// ShmSize is what the claim's config (GPUConfig.sharedMemorySize) asks
	// of its tmpfs; Options.ShmSize when 0. The claim's tmpfs holds the
	// largest its shares ask.
	ShmSize uint64
	// ShmMax is the most ShmSize may be (GPUConfig.maxSharedMemorySize,
	// the DeviceClass's); Options.ShmSize, the agent's default, when 0.
	ShmMax uint64
}

// Record is a share's undo record, kept in the checkpoint.
type Record struct {
	Tier      Tier   `json:"tier"`
	UUID      string `json:"uuid"`
	Slice     uint64 `json:"sliceBytes"`
	Region    string `json:"region,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	ShmSize   uint64 `json:"shmSizeBytes,omitempty"`
}

// gpuState is a shared GPU's file: written before its compute mode is
// changed, so that the former mode is restored after any crash.
type gpuState struct {
	FormerComputeMode gpu.ComputeMode `json:"formerComputeMode"`
	Tier              Tier            `json:"tier"`
}

// Manager prepares and undoes GPU memory shares.
type Manager struct {
	opts   Options
	mu     sync.Mutex
	shares map[string]Request
}

// New returns the manager; Restore brings back what the checkpoint holds.
func New(opts Options) *Manager {
	if opts.ShmDir == "" {
		opts.ShmDir = filepath.Join(filepath.Dir(opts.Dir), "mps-shm")
	}
	return &Manager{opts: opts, shares: map[string]Request{}}
}

func (m *Manager) gpuDir(uuid string) string { return filepath.Join(m.opts.Dir, uuid) }

// onGPU lists the shares on a GPU other than key, with m.mu held.
func (m *Manager) onGPU(uuid, key string) []Request {
	var out []Request
	for k, r := range m.shares {
		if r.UUID == uuid && k != key {
			out = append(out, r)
		}
	}
	return out
}

// ofClaim lists the claim's shares on a GPU other than key, with m.mu held:
// the shares one daemon serves.
func (m *Manager) ofClaim(claim types.UID, uuid, key string) []Request {
	var out []Request
	for _, r := range m.onGPU(uuid, key) {
		if r.ClaimUID == claim {
			out = append(out, r)
		}
	}
	return out
}

// Prepare makes a share real on its GPU's tier and returns its container
// edits and undo record. On failure nothing of it is left, and a GPU with
// no other share is given back as it was.
func (m *Manager) Prepare(ctx context.Context, r Request) (cdispec.ContainerEdits, Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := Record{Tier: r.Choice.Tier, UUID: r.UUID, Slice: r.Slice, Region: r.Choice.Region, Namespace: r.Namespace, Name: r.Name, ShmSize: r.ShmSize}
	switch r.Choice.Tier {
	case TierDMEM, TierMPSPoliced:
	default:
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: memory slices are not enforced here (%s); allocate it whole", r.UUID, r.Choice.Reason)
	}
	if r.Choice.Tier == TierMPSPoliced && m.opts.Police == nil {
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: mps-policed shares need the policing loop, which is not running", r.UUID)
	}
	if r.Slice == 0 {
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: a share of 0 bytes of memory", r.UUID)
	}
	if r.Choice.Tier == TierMPSPoliced && r.Slice <= m.opts.ContextReserve {
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: a slice of %d MiB leaves nothing beside a CUDA context's %d MiB (the agent's --mps-context-reserve): ask for more",
			r.UUID, r.Slice>>20, m.opts.ContextReserve>>20)
	}
	if bound := cmp.Or(r.ShmMax, m.opts.ShmSize, mps.DefaultShmSize); r.ShmSize > bound {
		// Its pages are on the node's memory, reserved by no one: the
		// admin bounds them in the DeviceClass, the claim does not.
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: sharedMemorySize %d MiB is over the %d MiB a claim may ask (the DeviceClass's maxSharedMemorySize, else the agent's --mps-shm-size)",
			r.UUID, r.ShmSize>>20, bound>>20)
	}
	if p := m.daemon(r.ClaimUID, r.UUID, r.Choice.Tier).PipeDir(); len(p) > mps.MaxPipeDir {
		return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: the MPS pipe directory %s is %d bytes long, over the %d its sockets' paths allow: choose a shorter --state-dir",
			r.UUID, p, len(p), mps.MaxPipeDir)
	}
	others, mine := m.onGPU(r.UUID, r.Key), m.ofClaim(r.ClaimUID, r.UUID, r.Key)
	if _, again := m.shares[r.Key]; !again {
		if r.Choice.Tier == TierMPSPoliced && m.opts.Policing != nil {
			if err := m.opts.Policing(r.UUID); err != nil {
				return cdispec.ContainerEdits{}, rec, fmt.Errorf("GPU %s: its shares' policing cannot read NVML, so no new share is held to its slice: %w", r.UUID, err)
			}
		}
		if err := m.checkLeft(ctx, r, others); err != nil {
			return cdispec.ContainerEdits{}, rec, err
		}
	}
	if err := m.setUp(ctx, r, append(mine, r)); err != nil {
		if _, again := m.shares[r.Key]; !again && len(mine) > 0 {
			if terr := removeShareFile(m.daemon(r.ClaimUID, r.UUID, r.Choice.Tier).Dir, r.Key); terr != nil {
				err = errors.Join(err, terr)
			}
		}
		if len(mine) == 0 {
			if terr := m.stopDaemon(ctx, m.daemon(r.ClaimUID, r.UUID, r.Choice.Tier)); terr != nil {
				err = errors.Join(err, fmt.Errorf("stopping the daemon of claim %s on GPU %s: %w", r.ClaimUID, r.UUID, terr))
			}
		}
		if len(others) == 0 {
			if terr := m.tearDown(ctx, r.UUID); terr != nil {
				err = errors.Join(err, fmt.Errorf("giving GPU %s back: %w", r.UUID, terr))
			}
		}
		return cdispec.ContainerEdits{}, rec, err
	}
	m.shares[r.Key] = r
	if r.Choice.Tier == TierMPSPoliced {
		m.opts.Police.Add(policeShare(r))
	}
	return m.edits(r), rec, nil
}

// checkLeft refuses a slice larger than the memory left on the GPU: what
// the other shares' slices leave of its total, and no more than is free.
func (m *Manager) checkLeft(ctx context.Context, r Request, others []Request) error {
	mem, err := m.opts.NVML.Memory(ctx, r.UUID)
	if err != nil {
		return fmt.Errorf("GPU %s: memory left: %w", r.UUID, err)
	}
	var promised uint64
	for _, o := range others {
		promised += o.Slice
	}
	left := uint64(0)
	if mem.Total > promised {
		left = mem.Total - promised
	}
	left = min(left, mem.Free)
	if r.Slice > left {
		return fmt.Errorf("GPU %s: a slice of %d MiB is more than the %d MiB left (total %d MiB, %d MiB promised to %d other share(s), %d MiB free)",
			r.UUID, r.Slice>>20, left>>20, mem.Total>>20, promised>>20, len(others), mem.Free>>20)
	}
	return nil
}

// edits give the container its claim's daemon of the GPU: the pipe
// directory at ContainerPipeDir(uuid), read-only, the claim's shared memory
// tmpfs as /dev/shm, and the variables that point a client at them. CDI keeps one value of a variable
// and one mount of a path, the last device's, so that a container with
// shares of several GPUs gets one daemon's CUDA_MPS_PIPE_DIRECTORY and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, always of one share; each share's own
// pair stays in CARVE_<REQUEST>_MPS_PIPE_DIRECTORY and
// CARVE_<REQUEST>_MPS_PINNED_DEVICE_MEM_LIMIT. A process reaches one daemon,
// so one process uses one shared GPU.
func (m *Manager) edits(r Request) cdispec.ContainerEdits {
	d := m.daemon(r.ClaimUID, r.UUID, r.Choice.Tier)
	pipe := ContainerPipeDir(r.UUID)
	e := cdispec.ContainerEdits{
		Env: []string{
			"CUDA_MPS_PIPE_DIRECTORY=" + pipe,
			r.EnvPrefix + "MPS_PIPE_DIRECTORY=" + pipe,
			r.EnvPrefix + "GPU_MEMORY_SLICE=" + strconv.FormatUint(r.Slice, 10),
			r.EnvPrefix + "GPU_MEMORY_ENFORCEMENT=" + string(r.Choice.Tier),
		},
		Mounts: []*cdispec.Mount{
			// Read-only: the root daemon writes its pid file and sockets
			// there, and a tenant must neither plant links nor remove
			// the control socket. A client still connects: connect(2)
			// to a unix socket is no write to the filesystem, and the
			// kernel's read-only-mount check does not apply to it.
			{HostPath: d.PipeDir(), ContainerPath: pipe, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
			{HostPath: d.ShmDir, ContainerPath: "/dev/shm", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
	}
	switch r.Choice.Tier {
	case TierMPSPoliced:
		limit := mps.ClientLimit(m.ceiling([]Request{r}))
		e.Env = append(e.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+limit, r.EnvPrefix+"MPS_PINNED_DEVICE_MEM_LIMIT="+limit)
	case TierDMEM:
		args := append(append([]string(nil), m.opts.HookArgs...), "--cgroup-root", m.opts.CgroupRoot,
			"--region", r.Choice.Region, "--max", strconv.FormatUint(r.Slice, 10), "--min", strconv.FormatUint(r.Slice, 10),
			"--record", m.recordDir(r.UUID, r.Key))
		e.Hooks = []*cdispec.Hook{{HookName: "createRuntime", Path: m.opts.HookPath, Args: args}}
	}
	return e
}

// recordDir is where a dmem share's hook records the pod cgroups it
// limited, for `carve shares` to check.
func (m *Manager) recordDir(uuid, key string) string {
	return RecordDir(m.opts.Dir, uuid, key)
}

// RecordDir is a dmem share's record directory below the shares' Dir.
func RecordDir(dir, uuid, key string) string {
	return filepath.Join(dir, uuid, "dmem", fileName(key))
}

// fileName makes a share key ("<claim uid>/<request>/<share id>") a file
// name.
func fileName(key string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		}
		return '_'
	}, key)
}

func policeShare(r Request) police.Share {
	return police.Share{Key: r.Key, ClaimUID: r.ClaimUID, Namespace: r.Namespace, Name: r.Name, ShareID: r.ShareID, UUID: r.UUID, Slice: r.Slice}
}

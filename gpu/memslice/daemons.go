package memslice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/prepare/atomicfile"
	"github.com/carve-dra/carve/prepare/crash"
)

// crashPoint is a fault point of the crash matrix between two steps of a
// claim daemon's set-up or teardown (crash.Point); tests replace it with
// one that ends the calling goroutine, as a killed agent ends.
var crashPoint = crash.Point

// Each claim's shares of a GPU have an MPS control daemon of their own,
// and each claim a tmpfs of its own as its daemons' and containers' /dev/shm:
//
//	<Dir>/mps/<claim id>/shm             the claim's tmpfs
//	<Dir>/mps/<claim id>/<gpu id>/pipe   a daemon's pipe directory
//	<Dir>/mps/<claim id>/<gpu id>/log    its log directory
//	<Dir>/mps/<claim id>/<gpu id>/owner.json
//
// One daemon per claim, not per GPU: a daemon serves one user at a time
// (a second UID's clients wait until the first's end, measured on an H100),
// its pipe directory and /dev/shm are where its clients meet it, and root in
// a container could remove its control socket or send it quit. Per claim,
// what a tenant can reach is its own. The ids are short hashes, so that a
// pipe directory's path fits mps.MaxPipeDir below any usual state
// directory. The tmpfs is per claim rather than per daemon because CDI
// gives a container one /dev/shm: a claim with shares of two GPUs reaches
// both of its daemons through it.
const daemonsDir = "mps"

// shmName is the claim's tmpfs in its directory; never a GPU id (hex).
const shmName = "shm"

// ownerFile names the claim and GPU a daemon directory is of, written
// before anything is started in it, for whoever finds it after a crash.
const ownerFile = "owner.json"

type owner struct {
	ClaimUID types.UID `json:"claimUID"`
	UUID     string    `json:"uuid"`
	Tier     Tier      `json:"tier"`
}

func shortID(s string, n int) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:n]
}

// ClaimDir is a claim's directory below the shares' Dir.
func ClaimDir(dir string, claim types.UID) string {
	return filepath.Join(dir, daemonsDir, shortID(string(claim), 12))
}

// ClaimShmDir is a claim's tmpfs below the shares' Dir.
func ClaimShmDir(dir string, claim types.UID) string {
	return filepath.Join(ClaimDir(dir, claim), shmName)
}

// DaemonDir is the directory of a claim's MPS daemon of GPU uuid below the
// shares' Dir (mps.Daemon.Dir).
func DaemonDir(dir string, claim types.UID, uuid string) string {
	return filepath.Join(ClaimDir(dir, claim), shortID(uuid, 8))
}

func (m *Manager) daemon(claim types.UID, uuid string, tier Tier) mps.Daemon {
	d := mps.Daemon{Path: m.opts.MPSControl, Dir: DaemonDir(m.opts.Dir, claim, uuid), UUID: uuid,
		ShmDir: ClaimShmDir(m.opts.Dir, claim), Start: m.opts.Start, Keep: m.opts.Keeper,
		LibDirs: m.opts.DriverLibDirs, Env: m.opts.DaemonEnv, Capabilities: m.opts.DaemonCapabilities}
	if tier == TierDMEM {
		d.Protocol = 3
	}
	return d
}

// setUp brings a claim's daemon of a GPU to serve its shares (all): the
// GPU's state file and compute mode, the daemon's owner record and its
// shares' records (records.go), the claim's tmpfs, the daemon and its
// ceiling. Every step is idempotent, and
// each is recorded on disk before it is taken.
func (m *Manager) setUp(ctx context.Context, r Request, all []Request) error {
	if err := m.holdComputeMode(ctx, r.UUID, r.Choice.Tier); err != nil {
		return err
	}
	crashPoint("gpushare-mode-held")
	d := m.daemon(r.ClaimUID, r.UUID, r.Choice.Tier)
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return fmt.Errorf("GPU %s: claim %s: %w", r.UUID, r.ClaimUID, err)
	}
	data, _ := json.Marshal(owner{ClaimUID: r.ClaimUID, UUID: r.UUID, Tier: r.Choice.Tier})
	if err := atomicfile.Write(filepath.Join(d.Dir, ownerFile), data, 0o644); err != nil {
		return fmt.Errorf("GPU %s: claim %s: record its daemon: %w", r.UUID, r.ClaimUID, err)
	}
	for _, s := range all {
		if err := writeShareFile(d.Dir, s); err != nil {
			return err
		}
	}
	crashPoint("gpushare-daemon-recorded")
	if err := m.shm(d.ShmDir, m.claimShmSize(r)); err != nil {
		return err
	}
	crashPoint("gpushare-shm-mounted")
	started, err := d.Ensure(ctx)
	if err != nil {
		return fmt.Errorf("GPU %s: claim %s: %w", r.UUID, r.ClaimUID, err)
	}
	if started {
		m.opts.Logger.Info("Started a claim's MPS control daemon", "gpu", r.UUID, "claim", r.Namespace+"/"+r.Name, "tier", r.Choice.Tier, "dir", d.Dir)
	}
	crashPoint("gpushare-daemon-started")
	if r.Choice.Tier == TierMPSPoliced {
		// A daemon-wide default: a client cannot raise it, as it can
		// raise the CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of its environment.
		return d.SetCeiling(ctx, m.ceiling(all))
	}
	return nil
}

// ceiling is the per-process MPS ceiling of a claim's daemon: the claim's
// memory on the GPU, the sum of its shares there (policing holds each pod to
// its own share), less a context's reserve (Options.ContextReserve): NVML's
// figure of a process counts its context beside what MPS lets it allocate.
func (m *Manager) ceiling(shares []Request) uint64 {
	var c uint64
	for _, s := range shares {
		c += s.Slice
	}
	if c <= m.opts.ContextReserve {
		// Prepare refuses such a slice; one prepared under a smaller
		// reserve (an agent started since with a larger one) keeps
		// its slice as its ceiling.
		return c
	}
	return c - m.opts.ContextReserve
}

// holdComputeMode records the GPU's mode and sets Default. Not
// EXCLUSIVE_PROCESS: that admits one MPS server per GPU, and each claim's
// daemon runs one. A process that skips MPS is then held by policing
// (mps-policed, killed within a tick) or by its cgroup's dmem limit (dmem).
// The mode is set for the GPU's first share and restored after its last,
// never per claim.
func (m *Manager) holdComputeMode(ctx context.Context, uuid string, tier Tier) error {
	path := filepath.Join(m.gpuDir(uuid), "gpu.json")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		st := gpuState{FormerComputeMode: gpu.ComputeModeDefault, Tier: tier}
		if !m.opts.KeepComputeMode {
			if st.FormerComputeMode, err = m.opts.NVML.ComputeMode(ctx, uuid); err != nil {
				return fmt.Errorf("GPU %s: %w", uuid, err)
			}
		}
		data, _ := json.Marshal(st)
		if err := os.MkdirAll(m.gpuDir(uuid), 0o755); err != nil {
			return fmt.Errorf("GPU %s: %w", uuid, err)
		}
		if err := atomicfile.Write(path, data, 0o644); err != nil {
			return fmt.Errorf("GPU %s: record its compute mode: %w", uuid, err)
		}
	}
	if m.opts.KeepComputeMode {
		return nil
	}
	mode, err := m.opts.NVML.ComputeMode(ctx, uuid)
	if err == nil && mode != gpu.ComputeModeDefault {
		err = m.opts.NVML.SetComputeMode(ctx, uuid, gpu.ComputeModeDefault)
	}
	if err != nil {
		return fmt.Errorf("GPU %s: compute mode Default, without which a second claim's MPS server could not run: %w", uuid, err)
	}
	return nil
}

// stopDaemon quits a claim's daemon of a GPU and removes its directory;
// with it the claim's last, it unmounts the claim's tmpfs and removes the
// claim's directory. Each step finds what an earlier, interrupted one
// left, so that it converges after a crash anywhere.
func (m *Manager) stopDaemon(ctx context.Context, d mps.Daemon) error {
	if err := d.Stop(ctx); err != nil {
		return fmt.Errorf("GPU %s: %w", d.UUID, err)
	}
	crashPoint("gpushare-daemon-stopped")
	return m.releaseClaim(filepath.Dir(d.Dir))
}

// releaseClaim unmounts a claim's tmpfs and removes its directory once no
// daemon directory is left in it.
func (m *Manager) releaseClaim(claimDir string) error {
	entries, err := os.ReadDir(claimDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("MPS claim directory: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != shmName {
			return nil
		}
	}
	if err := mps.UnmountShm(filepath.Join(claimDir, shmName)); err != nil {
		return err
	}
	crashPoint("gpushare-shm-unmounted")
	if ok, err := mps.IsShm(filepath.Join(claimDir, shmName)); err != nil || ok {
		return fmt.Errorf("the tmpfs of %s is still mounted (%v): its directory is kept", claimDir, err)
	}
	if err := os.RemoveAll(claimDir); err != nil {
		return fmt.Errorf("remove %s: %w", claimDir, err)
	}
	// The daemons' root goes with the last claim (a node without shares
	// keeps nothing); another claim's directory keeps it, and the error.
	// So does the daemons' cgroup.
	if err := os.Remove(filepath.Dir(claimDir)); err == nil && m.opts.Keeper != nil {
		if err := m.opts.Keeper.Release(); err != nil {
			return fmt.Errorf("the MPS daemons' cgroup: %w", err)
		}
	}
	return nil
}

// CheckShm mounts a probe tmpfs at ShmDir, checks that the host sees it
// where containers would mount a claim's from, and unmounts it.
func (m *Manager) CheckShm() error {
	err := m.shm(m.opts.ShmDir, m.opts.ShmSize)
	return errors.Join(err, mps.UnmountShm(m.opts.ShmDir))
}

// claimShmSize is the size of r's claim's tmpfs, with m.mu held: the
// largest any of its shares asks, Options.ShmSize for those that ask none.
func (m *Manager) claimShmSize(r Request) uint64 {
	size := func(s Request) uint64 {
		if s.ShmSize > 0 {
			return s.ShmSize
		}
		if m.opts.ShmSize > 0 {
			return m.opts.ShmSize
		}
		return mps.DefaultShmSize
	}
	n := size(r)
	for _, s := range m.shares {
		if s.ClaimUID == r.ClaimUID {
			n = max(n, size(s))
		}
	}
	return n
}

func (m *Manager) shm(dir string, size uint64) error {
	if err := mps.MountShm(dir, size); err != nil {
		return err
	}
	if err := mps.GrowShm(dir, size); err != nil {
		return err
	}
	if r := m.opts.HostRoot; r != "" && !mps.SameShm(dir, filepath.Join(r, dir)) {
		return fmt.Errorf("the MPS shared memory tmpfs at %s does not show on the host (%s): containers would not share it with the daemon; "+
			"the state directory's mount must propagate to the host (chart: stateDirPropagation: Bidirectional, with hostPID for its init container)", dir, filepath.Join(r, dir))
	}
	return nil
}

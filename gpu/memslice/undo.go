package memslice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
)

// Unprepare takes a share back. The claim's last share of a GPU stops its
// daemon (and, the claim's last daemon, unmounts its tmpfs); otherwise the
// daemon's ceiling comes down to the claim's shares left. The GPU's last
// share restores its compute mode. A share this manager does not hold (a
// crash before Prepare returned) is found by its key's claim UID and uuid.
func (m *Manager) Unprepare(ctx context.Context, key, uuid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unprepare(ctx, key, uuid)
}

// unprepare is Unprepare with m.mu held.
func (m *Manager) unprepare(ctx context.Context, key, uuid string) error {
	claim, _, _ := strings.Cut(key, "/") // ShareKey: "<claim uid>/<request>/<share id>"
	tier := TierMPSPoliced
	if r, ok := m.shares[key]; ok {
		uuid, claim, tier = r.UUID, string(r.ClaimUID), r.Choice.Tier
	}
	if uuid == "" {
		return fmt.Errorf("GPU share %s: no GPU to take it back from", key)
	}
	mine := m.ofClaim(types.UID(claim), uuid, key)
	if len(mine) == 0 {
		if err := m.stopDaemon(ctx, m.daemon(types.UID(claim), uuid, tier)); err != nil {
			return fmt.Errorf("GPU share %s: %w", key, err)
		}
	} else {
		// The record first: a crash after it leaves the checkpoint's
		// share, which the next start records again.
		if err := removeShareFile(m.daemon(types.UID(claim), uuid, tier).Dir, key); err != nil {
			return err
		}
		if mine[0].Choice.Tier == TierMPSPoliced {
			if err := m.daemon(types.UID(claim), uuid, TierMPSPoliced).SetCeiling(ctx, m.ceiling(mine)); err != nil {
				return fmt.Errorf("GPU share %s: %w", key, err)
			}
		}
	}
	crashPoint("gpushare-claim-released")
	if len(m.onGPU(uuid, key)) == 0 && !m.otherDaemonsOn(uuid, DaemonDir(m.opts.Dir, types.UID(claim), uuid)) {
		if err := m.tearDown(ctx, uuid); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(m.recordDir(uuid, key)); err != nil {
		return fmt.Errorf("GPU share %s: %w", key, err)
	}
	delete(m.shares, key)
	if m.opts.Police != nil {
		m.opts.Police.Remove(key)
	}
	return nil
}

// otherDaemonsOn tells whether a daemon directory other than except serves
// GPU uuid on the node: one whose shares no record explains (kept after a
// checkpoint loss) still needs the GPU's compute mode.
func (m *Manager) otherDaemonsOn(uuid, except string) bool {
	ds, _ := m.daemonsOnNode()
	for _, d := range ds {
		if d.dir != except && d.owner.UUID == uuid {
			return true
		}
	}
	return false
}

// UnprepareClaim takes back everything of a claim the checkpoint does not
// know (it was lost or corrupt): the shares adopted from the node's records
// at Restore, any recorded in the claim's directory since, and the claim's
// daemons no record explains, found by the claim's derived directory. The
// kubelet asks for it when it unprepares the claim; the driver passes it
// here as it does to every prepare.ClaimCleaner.
func (m *Manager) UnprepareClaim(ctx context.Context, claim types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for key, r := range m.shares {
		if r.ClaimUID != claim {
			continue
		}
		m.opts.Logger.Info("Taking back a GPU share the checkpoint does not know", "claimUID", claim, "share", key, "gpu", r.UUID)
		if err := m.unprepare(ctx, key, r.UUID); err != nil {
			errs = append(errs, err)
		}
	}
	ds, err := m.daemonsOfClaimDir(ClaimDir(m.opts.Dir, claim))
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, d := range ds {
		for _, r := range d.shares {
			if err := m.unprepare(ctx, r.Key, r.UUID); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := os.Stat(d.dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if d.owner.ClaimUID != "" && d.owner.ClaimUID != claim {
			errs = append(errs, fmt.Errorf("MPS daemon directory %s names claim %s, not %s: left alone", d.dir, d.owner.ClaimUID, claim))
			continue
		}
		uuid := d.owner.UUID
		m.opts.Logger.Info("Stopping an MPS daemon of a claim the checkpoint does not know", "claimUID", claim, "gpu", uuid, "dir", d.dir)
		if err := m.stopDaemon(ctx, mps.Daemon{Path: m.opts.MPSControl, Dir: d.dir, UUID: uuid, LibDirs: m.opts.DriverLibDirs, Env: m.opts.DaemonEnv}); err != nil {
			errs = append(errs, err)
			continue
		}
		if uuid != "" && len(m.onGPU(uuid, "")) == 0 && !m.otherDaemonsOn(uuid, "") {
			if err := m.tearDown(ctx, uuid); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// A tmpfs left without a daemon (a crash between the last daemon's
	// stop and the unmount).
	if err := m.releaseClaim(ClaimDir(m.opts.Dir, claim)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// tearDown gives a GPU back once no share is on it: its former compute
// mode restored, its directory removed. A GPU never set up is left alone.
func (m *Manager) tearDown(ctx context.Context, uuid string) error {
	dir := m.gpuDir(uuid)
	raw, err := os.ReadFile(filepath.Join(dir, "gpu.json"))
	if errors.Is(err, os.ErrNotExist) {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	var st gpuState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("GPU %s: state %s: %w", uuid, filepath.Join(dir, "gpu.json"), err)
	}
	// A daemon of the GPU as a whole, as agents before per-claim daemons
	// ran one (<gpu dir>/mps), goes with the GPU's last share.
	if err := (mps.Daemon{Path: m.opts.MPSControl, Dir: filepath.Join(dir, "mps"), UUID: uuid, LibDirs: m.opts.DriverLibDirs, Env: m.opts.DaemonEnv}).Stop(ctx); err != nil {
		return fmt.Errorf("GPU %s: the GPU-wide daemon of an earlier agent: %w", uuid, err)
	}
	if !m.opts.KeepComputeMode {
		mode, err := m.opts.NVML.ComputeMode(ctx, uuid)
		if err == nil && mode != st.FormerComputeMode {
			err = m.opts.NVML.SetComputeMode(ctx, uuid, st.FormerComputeMode)
		}
		if err != nil {
			return fmt.Errorf("GPU %s: restore compute mode %d: %w", uuid, st.FormerComputeMode, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	m.opts.Logger.Info("Gave a shared GPU back", "gpu", uuid, "computeMode", st.FormerComputeMode)
	return nil
}

// Restore runs at start with the shares the checkpoint holds as prepared.
// The node's own records (records.go) are read too: a share recorded there
// that the checkpoint does not hold (the checkpoint was lost or corrupt, or
// a claim crashed before its record, which the driver then rolls back) is
// adopted as the checkpoint's are. Each claim's daemon of each GPU is
// started again (adopted where it still runs) with its ceiling, each GPU
// gets its mode back, and the shares are policed again: a lost checkpoint
// never tears down what runs. A daemon directory no record explains (an
// earlier agent's, or an unreadable record) is kept and reported, never
// stopped: the kubelet's unprepare of its claim finds it by the claim's
// derived directory (UnprepareClaim). Only a GPU directory that no share and
// no daemon holds is given back (mode restored).
func (m *Manager) Restore(ctx context.Context, shares []Request) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	type unit struct {
		claim types.UID
		uuid  string
	}
	for _, r := range shares {
		m.shares[r.Key] = r
	}
	var errs []error
	onNode, err := m.daemonsOnNode()
	if err != nil {
		errs = append(errs, err)
	}
	gpus := map[string]bool{}
	for _, d := range onNode {
		errs = append(errs, d.bad...)
		if d.owner.UUID != "" {
			gpus[d.owner.UUID] = true
		}
		explained := false
		for _, r := range d.shares {
			explained = true
			if _, ok := m.shares[r.Key]; ok {
				continue
			}
			m.opts.Logger.Info("Adopting a GPU share recorded on the node that the checkpoint does not hold; it stays enforced until its claim is unprepared",
				"claim", r.Namespace+"/"+r.Name, "claimUID", r.ClaimUID, "share", r.Key, "gpu", r.UUID, "sliceBytes", r.Slice)
			m.shares[r.Key] = r
		}
		for _, r := range shares {
			explained = explained || DaemonDir(m.opts.Dir, r.ClaimUID, r.UUID) == d.dir
		}
		if !explained {
			m.opts.Logger.Info("Keeping an MPS daemon that no share record explains (was the checkpoint lost?); its claim's unprepare stops it",
				"dir", d.dir, "claimUID", d.owner.ClaimUID, "gpu", d.owner.UUID)
		}
	}
	byDaemon := map[unit][]Request{}
	for _, r := range m.shares {
		u := unit{r.ClaimUID, r.UUID}
		byDaemon[u] = append(byDaemon[u], r)
		gpus[r.UUID] = true
		if r.Choice.Tier == TierMPSPoliced && m.opts.Police != nil {
			m.opts.Police.Add(policeShare(r))
		}
	}
	for _, rs := range byDaemon {
		if err := m.setUp(ctx, rs[0], rs); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == daemonsDir || gpus[e.Name()] {
			continue
		}
		m.opts.Logger.Info("Giving back a shared GPU that no share or daemon holds", "gpu", e.Name())
		if err := m.tearDown(ctx, e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Compile-time check that the node's NVML session serves the manager.
var _ NVML = (*gpu.Session)(nil)

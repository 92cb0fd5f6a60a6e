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
	} else if mine[0].Choice.Tier == TierMPSPoliced {
		if err := m.daemon(types.UID(claim), uuid, TierMPSPoliced).SetCeiling(ctx, ceiling(mine)); err != nil {
			return fmt.Errorf("GPU share %s: %w", key, err)
		}
	}
	crashPoint("gpushare-claim-released")
	if len(m.onGPU(uuid, key)) == 0 {
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
	if err := (mps.Daemon{Path: m.opts.MPSControl, Dir: filepath.Join(dir, "mps"), UUID: uuid}).Stop(ctx); err != nil {
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

// Restore runs at start with the shares the checkpoint holds as prepared:
// each claim's daemon of each GPU is started again (adopted where it still
// runs) with its ceiling, each GPU gets its mode back, and the shares are
// policed again. A daemon, claim tmpfs or GPU directory no share owns (a
// crash between setting it up and recording the claim) is given back.
func (m *Manager) Restore(ctx context.Context, shares []Request) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	type unit struct {
		claim types.UID
		uuid  string
	}
	byDaemon := map[unit][]Request{}
	owned := map[string]bool{} // daemon directories
	gpus := map[string]bool{}
	for _, r := range shares {
		m.shares[r.Key] = r
		u := unit{r.ClaimUID, r.UUID}
		byDaemon[u] = append(byDaemon[u], r)
		owned[DaemonDir(m.opts.Dir, r.ClaimUID, r.UUID)] = true
		gpus[r.UUID] = true
		if r.Choice.Tier == TierMPSPoliced && m.opts.Police != nil {
			m.opts.Police.Add(policeShare(r))
		}
	}
	var errs []error
	for _, rs := range byDaemon {
		if err := m.setUp(ctx, rs[0], rs); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.stopUnowned(ctx, owned))
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == daemonsDir || gpus[e.Name()] {
			continue
		}
		m.opts.Logger.Info("Giving back a shared GPU that no checkpointed share holds", "gpu", e.Name())
		if err := m.tearDown(ctx, e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stopUnowned stops every daemon whose directory is not owned, and releases
// every claim directory left without a daemon.
func (m *Manager) stopUnowned(ctx context.Context, owned map[string]bool) error {
	root := filepath.Join(m.opts.Dir, daemonsDir)
	claims, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("MPS daemons: %w", err)
	}
	var errs []error
	for _, c := range claims {
		claimDir := filepath.Join(root, c.Name())
		daemons, err := os.ReadDir(claimDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("MPS daemons: %w", err))
			continue
		}
		for _, e := range daemons {
			dir := filepath.Join(claimDir, e.Name())
			if !e.IsDir() || e.Name() == shmName || owned[dir] {
				continue
			}
			d := mps.Daemon{Path: m.opts.MPSControl, Dir: dir, UUID: e.Name()}
			var o owner
			if raw, err := os.ReadFile(filepath.Join(dir, ownerFile)); err == nil && json.Unmarshal(raw, &o) == nil && o.UUID != "" {
				d.UUID = o.UUID
			}
			m.opts.Logger.Info("Stopping an MPS daemon that no checkpointed share holds", "gpu", d.UUID, "claimUID", o.ClaimUID, "dir", dir)
			if err := d.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("GPU %s: %w", d.UUID, err))
			}
		}
		if err := m.releaseClaim(claimDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Compile-time check that the node's NVML session serves the manager.
var _ NVML = (*gpu.Session)(nil)

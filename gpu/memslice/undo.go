package memslice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
)

// Unprepare takes a share back. The last share of a GPU stops its daemon
// and restores its compute mode; a GPU left with shares gets the ceiling of
// the largest one left. A share this manager does not hold (a crash before
// Prepare returned) still gives its GPU back when no other share is on it.
func (m *Manager) Unprepare(ctx context.Context, key, uuid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.shares[key]; ok {
		uuid = r.UUID
	}
	if uuid == "" {
		return fmt.Errorf("GPU share %s: no GPU to take it back from", key)
	}
	rest := m.onGPU(uuid, key)
	if len(rest) == 0 {
		if err := m.tearDown(ctx, uuid); err != nil {
			return err
		}
	} else if rest[0].Choice.Tier == TierMPSPoliced {
		if err := m.daemon(uuid, TierMPSPoliced).SetCeiling(ctx, ceiling(rest)); err != nil {
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

// tearDown gives a GPU back: its daemon stopped, its former compute mode
// restored, its directory removed. A GPU never set up is left alone.
func (m *Manager) tearDown(ctx context.Context, uuid string) error {
	dir := m.gpuDir(uuid)
	raw, err := os.ReadFile(filepath.Join(dir, "gpu.json"))
	if errors.Is(err, os.ErrNotExist) {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		return m.releaseShm()
	}
	if err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
	}
	var st gpuState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("GPU %s: state %s: %w", uuid, filepath.Join(dir, "gpu.json"), err)
	}
	if err := m.daemon(uuid, st.Tier).Stop(ctx); err != nil {
		return fmt.Errorf("GPU %s: %w", uuid, err)
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
	return m.releaseShm()
}

// releaseShm unmounts the shared memory tmpfs once no GPU is set up for
// shares (no daemon uses it).
func (m *Manager) releaseShm() error {
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			return nil
		}
	}
	return mps.UnmountShm(m.opts.ShmDir)
}

// Restore runs at start with the shares the checkpoint holds as prepared:
// each GPU with shares gets its mode, daemon (adopted where it still runs)
// and ceiling back, and is policed again; a GPU directory no share owns (a
// crash between starting a daemon and recording the claim) is given back.
func (m *Manager) Restore(ctx context.Context, shares []Request) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	byGPU := map[string][]Request{}
	for _, r := range shares {
		m.shares[r.Key] = r
		byGPU[r.UUID] = append(byGPU[r.UUID], r)
		if r.Choice.Tier == TierMPSPoliced && m.opts.Police != nil {
			m.opts.Police.Add(policeShare(r))
		}
	}
	var errs []error
	for _, rs := range byGPU {
		if err := m.setUp(ctx, rs[0], rs); err != nil {
			errs = append(errs, err)
		}
	}
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		if !e.IsDir() || len(byGPU[e.Name()]) > 0 {
			continue
		}
		m.opts.Logger.Info("Giving back a shared GPU that no checkpointed share holds", "gpu", e.Name())
		if err := m.tearDown(ctx, e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	if len(byGPU) == 0 {
		errs = append(errs, m.releaseShm())
	}
	return errors.Join(errs...)
}

// Compile-time check that the node's NVML session serves the manager.
var _ NVML = (*gpu.Session)(nil)

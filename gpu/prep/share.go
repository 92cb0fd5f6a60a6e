package prep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// prepareShare gives the container the whole GPU's nodes and libraries,
// held to the share's memory slice by the GPU's tier.
func (p *Preparer) prepareShare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if p.opts.Shares == nil {
		return prepare.Prepared{}, fmt.Errorf("GPU %s: shares are not offered on this node; allocate it whole or as a MIG device", a.Device)
	}
	if dev.GPU.MIG != nil {
		return prepare.Prepared{}, fmt.Errorf("MIG device %s: shares are not offered; allocate it whole", a.Device)
	}
	req, err := shareRequest(a, dev)
	if err != nil {
		return prepare.Prepared{}, err
	}
	edits, err := p.wholeGPUEdits(ctx, dev.GPU.Device)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("GPU %s: %w", a.Device, err)
	}
	share, rec, err := p.opts.Shares.Prepare(ctx, req)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("GPU %s: %w", a.Device, err)
	}
	undo, err := json.Marshal(rec)
	if err != nil {
		return prepare.Prepared{}, err
	}
	edits.Env = append(edits.Env, a.EnvPrefix()+"GPU_UUID="+dev.GPU.Device.UUID)
	edits.Env = append(edits.Env, share.Env...)
	edits.Mounts = append(edits.Mounts, share.Mounts...)
	edits.Hooks = append(edits.Hooks, share.Hooks...)
	return prepare.Prepared{Edits: edits, Undo: undo}, nil
}

// shareRequest is the share the allocation asks for on the published GPU.
func shareRequest(a prepare.Allocation, dev slices.Entry) (memslice.Request, error) {
	q, ok := a.Consumed[names.CapMemory]
	if !ok || q.Sign() <= 0 {
		return memslice.Request{}, fmt.Errorf("GPU %s: share %s consumes no memory", a.Device, *a.ShareID)
	}
	m := dev.GPU.Memory
	var shm, shmMax uint64
	if len(a.Config) > 0 {
		var cfg prepare.EffectiveConfig
		if err := json.Unmarshal(a.Config, &cfg); err != nil {
			return memslice.Request{}, fmt.Errorf("GPU %s: share %s: config: %w", a.Device, *a.ShareID, err)
		}
		if cfg.GPU != nil && cfg.GPU.SharedMemorySize != nil {
			shm = uint64(cfg.GPU.SharedMemorySize.Value())
		}
		if cfg.GPU != nil && cfg.GPU.MaxSharedMemorySize != nil {
			shmMax = uint64(cfg.GPU.MaxSharedMemorySize.Value())
		}
	}
	return memslice.Request{ShmSize: shm, ShmMax: shmMax,
		Key: a.ShareKey(), ClaimUID: a.ClaimUID, Namespace: a.ClaimNamespace, Name: a.ClaimName, ShareID: string(*a.ShareID),
		UUID: dev.GPU.Device.UUID, Slice: uint64(q.Value()), EnvPrefix: a.EnvPrefix(),
		Choice: memslice.Choice{Tier: memslice.Tier(m.Enforcement), Reason: m.Reason, Region: m.Region},
	}, nil
}

// unprepareShare takes a share back; without its record (a crash before
// Prepare returned) its GPU is found from the published device.
func (p *Preparer) unprepareShare(ctx context.Context, a prepare.Allocation, undo json.RawMessage) error {
	if p.opts.Shares == nil {
		return nil
	}
	var rec memslice.Record
	if len(undo) > 0 {
		if err := json.Unmarshal(undo, &rec); err != nil {
			return fmt.Errorf("GPU share %s: undo record: %w", a.Device, err)
		}
	} else if e, ok := p.lookup(a.Device); ok && e.GPU != nil {
		rec.UUID = e.GPU.Device.UUID
	}
	return p.opts.Shares.Unprepare(ctx, a.ShareKey(), rec.UUID)
}

// restoreShares hands the manager the shares the checkpoint holds as
// prepared; it gives back GPUs none of them holds.
func (p *Preparer) restoreShares(ctx context.Context, allocs []prepare.Allocation, undo []json.RawMessage) {
	if p.opts.Shares == nil {
		return
	}
	var shares []memslice.Request
	for i, a := range allocs {
		if a.Kind != names.KindGPU || a.ShareID == nil || i >= len(undo) || len(undo[i]) == 0 {
			continue
		}
		var rec memslice.Record
		if err := json.Unmarshal(undo[i], &rec); err != nil {
			p.opts.Logger.Error(err, "GPU share record unreadable; its share is not restored", "claim", a.ClaimNamespace+"/"+a.ClaimName)
			continue
		}
		r := memslice.Request{Key: a.ShareKey(), ClaimUID: a.ClaimUID, Namespace: a.ClaimNamespace, Name: a.ClaimName,
			ShareID: string(*a.ShareID), UUID: rec.UUID, Slice: rec.Slice, EnvPrefix: a.EnvPrefix(), ShmSize: rec.ShmSize,
			Choice: memslice.Choice{Tier: rec.Tier, Region: rec.Region}}
		shares = append(shares, r)
	}
	if err := p.opts.Shares.Restore(ctx, shares); err != nil {
		p.opts.Logger.Error(err, "Restoring GPU shares")
	}
}

// UnprepareClaim takes back what a claim the checkpoint does not know (it
// was lost or corrupt) still holds: its GPU shares (Restore adopted them
// from the node's records, and they stayed enforced), found by the claim's
// derived directory, and its MIG instances, found by their records on the
// node (lost.go) and destroyed.
func (p *Preparer) UnprepareClaim(ctx context.Context, claim types.UID) error {
	var errs []error
	if p.opts.Shares != nil {
		if err := p.opts.Shares.UnprepareClaim(ctx, claim); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.unprepareLostMIG(ctx, claim); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

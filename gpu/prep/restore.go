package prep

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

// Restore runs at start with every checkpointed allocation: GPU memory
// shares are restored (and GPUs no share holds given back); a MIG instance
// recorded on the node for a claim the checkpoint lost is adopted (its
// claim's unprepare destroys it, UnprepareClaim), and one that neither
// the checkpoint nor a record owns (made by hand) is reported, never
// destroyed.
func (p *Preparer) Restore(allocs []prepare.Allocation, undo []json.RawMessage) {
	if p.opts.NVML == nil {
		return
	}
	shareCtx, cancelShares := context.WithTimeout(context.Background(), time.Minute)
	p.restoreShares(shareCtx, allocs, undo)
	cancelShares()
	owned := map[string]types.UID{}
	for i, a := range allocs {
		if a.Kind != names.KindMIG {
			continue
		}
		var rec migRecord
		if i < len(undo) && len(undo[i]) > 0 && json.Unmarshal(undo[i], &rec) == nil {
			owned[rec.key()] = a.ClaimUID
		} else if e, ok := p.lookup(a.Device); ok && e.GPU != nil && e.GPU.MIG != nil {
			owned[recordFor(*e.GPU).key()] = a.ClaimUID
		}
	}
	lost, contested := p.lostRecords(owned)
	for key, recs := range lost {
		if !contested[key] {
			owned[key] = recs[0].ClaimUID
		}
	}
	p.mu.Lock()
	p.owned, p.contested, p.restored = owned, contested, true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var found []string
	err := p.opts.NVML.Do(ctx, "list MIG instances", func(l gpu.Library) error {
		var err error
		found, err = listInstances(l)
		return err
	})
	if err != nil {
		// Recorded instances stay adopted: their placements are taken
		// until their claims' unprepare finds out.
		p.opts.Logger.Error(err, "Listing MIG instances at start; unowned instances are not reported")
		return
	}
	p.settleLost(lost, found)
	var unowned []string
	for _, key := range found {
		if !p.owns(key) {
			unowned = append(unowned, key)
			p.opts.Logger.Info("MIG instance found that no claim owns; left in place", "instance", key)
		}
	}
	p.mu.Lock()
	p.unowned = unowned
	p.mu.Unlock()
}

// Unowned lists the MIG instances Restore found that no claim owns, as
// "<parent uuid>/profile-<id>/placement-<start>", the profile's NVML Id.
func (p *Preparer) Unowned() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unowned...)
}

// instanceKey names an instance by its profile's Id, which both a record
// and NVML's instance list carry: never the index.
func instanceKey(uuid string, profile, start int) string {
	return fmt.Sprintf("%s/profile-%d/placement-%d", uuid, profile, start)
}

// listInstances lists every GPU instance on every MIG-enabled GPU.
func listInstances(l gpu.Library) ([]string, error) {
	n, ret := l.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("device count: %s", nvml.ErrorString(ret))
	}
	var out []string
	for i := 0; i < n; i++ {
		dev, ret := l.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("device %d: %s", i, nvml.ErrorString(ret))
		}
		if mode, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || mode != nvml.DEVICE_MIG_ENABLE {
			continue
		}
		uuid, _ := dev.GetUUID()
		gpu.EachGPUInstance(dev, func(profile nvml.GpuInstanceProfileInfo, info nvml.GpuInstanceInfo) bool {
			out = append(out, instanceKey(uuid, int(profile.Id), int(info.Placement.Start)))
			return true
		})
	}
	return out, nil
}

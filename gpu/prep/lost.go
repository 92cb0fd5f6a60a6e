package prep

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/types"
)

// lostRecords reads the node's MIG records and returns, by instance, those
// of claims the checkpoint does not hold (owned: the checkpoint's owners),
// and the instances two or more such records name: which of them made it
// cannot be told, so neither's unprepare may destroy it. A record that names
// an instance the checkpoint gives another claim is reported and left
// alone.
func (p *Preparer) lostRecords(owned map[string]types.UID) (map[string][]nodeRecord, map[string]bool) {
	recs, errs := p.readNodeRecords(nil)
	for _, err := range errs {
		p.opts.Logger.Error(err, "MIG node record refused; nothing is adopted or destroyed for it")
	}
	lost := map[string][]nodeRecord{}
	contested := map[string]bool{}
	for _, r := range recs {
		key := r.Instance.key()
		if owner, ok := owned[key]; ok {
			if owner != r.ClaimUID {
				p.opts.Logger.Error(nil, "A MIG node record names an instance the checkpoint gives another claim; left alone",
					"claimUID", r.ClaimUID, "device", r.Device, "instance", key, "checkpointClaimUID", owner)
			}
			continue
		}
		lost[key] = append(lost[key], r)
		if len(lost[key]) > 1 {
			contested[key] = true
		}
	}
	return lost, contested
}

// settleLost, once NVML has listed the instances found, logs the adoption
// of each lost claim's recorded instance that exists, and removes the
// records of those that do not (a crash between the record and the
// instance, or between the destroy and the record's removal), which frees
// their placements.
func (p *Preparer) settleLost(lost map[string][]nodeRecord, found []string) {
	exists := map[string]bool{}
	for _, key := range found {
		exists[key] = true
	}
	keys := make([]string, 0, len(lost))
	for key := range lost {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		recs := lost[key]
		switch {
		case !exists[key]:
			for _, r := range recs {
				if err := p.removeNodeRecord(r.ClaimUID, r.Device); err != nil {
					p.opts.Logger.Error(err, "Removing the node record of a MIG instance that no longer exists; its placement stays taken")
					continue
				}
				p.opts.Logger.Info("Removed the node record of a MIG instance that no longer exists", "claimUID", r.ClaimUID, "device", r.Device, "instance", key)
			}
			if p.recordsGone(recs) {
				p.forget(recs[0].Instance)
			}
		case len(recs) > 1:
			claims := make([]types.UID, 0, len(recs))
			for _, r := range recs {
				claims = append(claims, r.ClaimUID)
			}
			p.opts.Logger.Error(nil, "A MIG instance is recorded on the node for more than one claim the checkpoint does not hold; its placement stays taken, and none of their unprepares destroys it",
				"instance", key, "claimUIDs", claims)
		default:
			r := recs[0]
			p.opts.Logger.Info("Adopting a MIG instance recorded on the node that the checkpoint does not hold; it stays its claim's until that claim is unprepared",
				"claimUID", r.ClaimUID, "device", r.Device, "instance", key, "gpuInstance", r.Instance.GPUInstanceID, "idsKnown", r.IDsKnown)
		}
	}
}

// recordsGone tells whether none of the records is on the node any more.
func (p *Preparer) recordsGone(recs []nodeRecord) bool {
	for _, r := range recs {
		if p.nodeRecordExists(r.ClaimUID, r.Device) {
			return false
		}
	}
	return true
}

// owns tells whether a claim (by the checkpoint or a record) holds the
// instance, or two claims' records contest it.
func (p *Preparer) owns(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.owned[key]
	return ok || p.contested[key]
}

// unprepareLostMIG destroys the MIG instances recorded on the node for a
// claim the checkpoint does not know, then removes their records: each
// step is safe to repeat, so a crash at any point converges on the
// kubelet's retry or the next start. A record the checkpoint or another
// record gives to another claim is left alone, and logged.
func (p *Preparer) unprepareLostMIG(ctx context.Context, claim types.UID) error {
	recs, errs := p.readNodeRecords(&claim)
	for _, err := range errs {
		p.opts.Logger.Error(err, "MIG node record refused; nothing is destroyed for it", "claimUID", claim)
	}
	var out []error
	for _, r := range recs {
		if r.ClaimUID != claim {
			continue // derived from another UID with the same hash prefix
		}
		if holder, ok := p.heldByOther(r.Instance, claim); ok {
			p.opts.Logger.Error(nil, "A MIG node record of a claim the checkpoint does not know names an instance held by another; left alone",
				"claimUID", claim, "device", r.Device, "instance", r.Instance.key(), "heldBy", holder)
			continue
		}
		if p.opts.NVML == nil {
			out = append(out, fmt.Errorf("MIG device %s of claim %s: %w", r.Device, claim, errNoNVML))
			continue
		}
		p.opts.Logger.Info("Destroying a MIG instance of a claim the checkpoint does not know", "claimUID", claim, "device", r.Device, "instance", r.Instance.key())
		var wantGI *uint32
		if r.IDsKnown {
			wantGI = &r.Instance.GPUInstanceID
		}
		if err := p.destroyMIG(ctx, r.Device, r.Instance, wantGI); err != nil {
			out = append(out, fmt.Errorf("claim %s: %w", claim, err))
			continue
		}
		crashPoint("mig-destroyed")
		if err := p.removeNodeRecord(claim, r.Device); err != nil {
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

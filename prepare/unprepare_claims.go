package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"os"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare/crash"
)

// UnprepareResourceClaims undoes claims; a claim this agent does not know is
// already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	uids := make([]types.UID, len(claims))
	for i, c := range claims {
		uids[i] = c.UID
	}
	defer d.locks.lock(uids)()
	records, err := d.opts.Checkpoint.Lookup(uids...)
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		rec, ok := records[c.UID]
		if !ok {
			// Unknown here, but a preparer may still hold something of
			// it (the record was lost): clean up from its own state.
			out[c.UID] = d.cleanUnknown(ctx, c)
			continue
		}
		if err := d.undo(ctx, rec); err != nil {
			klog.FromContext(ctx).Error(err, "Unprepare failed; the kubelet will retry", "claim", c.NamespacedName)
			out[c.UID] = fmt.Errorf("unprepare claim %s: %w", c.NamespacedName, err)
			continue
		}
		crash.Point("unprepare-undone")
		// Every claim needs an entry: the kubelet takes a missing one
		// for a claim the driver skipped, and retries.
		out[c.UID] = nil
		if err := d.opts.Checkpoint.Update(func(recs *Records) error {
			recs.Delete(c.UID)
			d.opts.Metrics.PreparedClaims.Set(float64(countCompleted(recs.All())))
			return nil
		}); err != nil {
			out[c.UID] = fmt.Errorf("unprepare claim %s: %w", c.NamespacedName, err)
		}
	}
	return out, nil
}

// undo reverses a claim's devices in reverse order, then removes its CDI
// spec and info file. It is idempotent and works from a started record too.
func (d *Driver) undo(ctx context.Context, rec ClaimRecord) error {
	var errs []error
	for i := len(rec.Allocations) - 1; i >= 0; i-- {
		a := rec.Allocations[i]
		var undo json.RawMessage
		if i < len(rec.Undo) {
			undo = rec.Undo[i]
		}
		p, ok := d.opts.Preparers[a.Kind]
		if !ok {
			errs = append(errs, fmt.Errorf("device %s: no preparer for kind %s", a.Device, a.Kind))
			continue
		}
		start := time.Now()
		err := p.Unprepare(ctx, a, undo)
		d.opts.Metrics.observeUnprepare(a.Kind, err, time.Since(start))
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", a.Device, err))
		}
		crash.Point(fmt.Sprintf("unprepare-device-%d", i))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := d.opts.CDI.Remove(string(rec.UID)); err != nil {
		return err
	}
	if err := os.Remove(d.claimInfoPath(rec.UID)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove claim info: %w", err)
	}
	return nil
}

func countCompleted(recs iter.Seq2[types.UID, ClaimRecord]) int {
	n := 0
	for _, r := range recs {
		if r.State == ClaimCompleted {
			n++
		}
	}
	return n
}

// cleanUnknown has every preparer that keeps its own records remove what it
// still holds of a claim the checkpoint does not know.
func (d *Driver) cleanUnknown(ctx context.Context, c kubeletplugin.NamespacedObject) error {
	var errs []error
	asked := map[ClaimCleaner]bool{} // one preparer may serve several kinds (gpu, mig)
	for kind, p := range d.opts.Preparers {
		if cleaner, ok := p.(ClaimCleaner); ok {
			if reflect.TypeOf(cleaner).Comparable() {
				if asked[cleaner] {
					continue
				}
				asked[cleaner] = true
			}
			if err := cleaner.UnprepareClaim(ctx, c.UID); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", kind, err))
			}
		}
	}
	if err := d.opts.CDI.Remove(string(c.UID)); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(d.claimInfoPath(c.UID)); err != nil && !os.IsNotExist(err) {
		errs = append(errs, fmt.Errorf("remove claim info: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		klog.FromContext(ctx).Error(err, "Cleaning up an unknown claim failed; the kubelet will retry", "claim", c.NamespacedName)
		return fmt.Errorf("unprepare claim %s: %w", c.NamespacedName, err)
	}
	return nil
}

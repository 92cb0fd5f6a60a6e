package prepare

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/prepare/crash"
	"github.com/carve-dra/carve/slices"
)

// claimWork is one claim of a prepare call on its way through the phases.
type claimWork struct {
	claim  *resourceapi.ResourceClaim
	allocs []Allocation
	result kubeletplugin.PrepareResult
	done   bool
	// rolledBack: a started record of this claim was undone, so the
	// record goes whatever happens next.
	rolledBack bool
	// dirty: a failed attempt could not be undone in full; the record
	// stays "started" so that the next attempt rolls it back again.
	dirty bool
}

// PrepareResourceClaims prepares every claim of a pod. Each claim is
// recorded as started before anything is applied and as completed after its
// CDI spec is written; a claim found completed is answered from the record.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	uids := make([]types.UID, len(claims))
	for i, c := range claims {
		uids[i] = c.UID
	}
	defer d.locks.lock(uids)()
	logger := klog.FromContext(ctx)
	records, err := d.opts.Checkpoint.Lookup(uids...)
	if err != nil {
		return nil, err
	}
	devices := d.opts.Devices()
	work := make([]*claimWork, 0, len(claims))
	for _, claim := range claims {
		w := &claimWork{claim: claim}
		work = append(work, w)
		if rec, ok := records[claim.UID]; ok {
			if rec.State == ClaimCompleted {
				w.result, w.done = resultFromRecord(rec), true
				continue
			}
			// Started but never completed: a crash came in between.
			logger.Info("Rolling back a claim whose preparation did not complete", "claim", klog.KObj(claim))
			if err := d.undo(ctx, rec); err != nil {
				w.result, w.done = kubeletplugin.PrepareResult{Err: fmt.Errorf("roll back earlier attempt: %w", err)}, true
				continue
			}
			w.rolledBack = true
		}
		if w.allocs, err = d.allocations(claim, devices); err != nil {
			w.result, w.done = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s: %w", klog.KObj(claim), err)}, true
		}
	}

	// Phase 1: record every valid claim as started, checking that no
	// device is used twice and no share exceeds its device. A claim whose
	// device another claim's record still holds waits, up to
	// ConflictWait, for that record to go (its unprepare on the way), with
	// no lock of the other claim's held.
	if err := d.recordStarted(ctx, work, devices); err != nil {
		return nil, err
	}
	crash.Point("prepare-started")

	// Phase 2: run the preparers and write each claim's CDI spec.
	completed := map[types.UID]ClaimRecord{}
	for _, w := range work {
		if w.done {
			continue
		}
		rec, err := d.prepareClaim(ctx, w.claim, w.allocs, devices)
		if err != nil {
			w.result = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s: %w", klog.KObj(w.claim), err)}
			w.dirty = errors.Is(err, errUndoFailed)
			continue
		}
		completed[w.claim.UID] = rec
		w.result = resultFromRecord(rec)
	}
	crash.Point("prepare-cdi-written")

	// Phase 3: record completion, and drop the records of claims that
	// failed (they were rolled back).
	err = d.opts.Checkpoint.Update(func(recs *Records) error {
		for _, w := range work {
			if w.done {
				continue
			}
			if rec, ok := completed[w.claim.UID]; ok {
				recs.Set(w.claim.UID, rec)
			} else if !w.dirty {
				recs.Delete(w.claim.UID)
			}
		}
		d.opts.Metrics.PreparedClaims.Set(float64(countCompleted(recs.All())))
		return nil
	})
	if err != nil {
		return nil, err
	}
	crash.Point("prepare-completed")

	out := make(map[types.UID]kubeletplugin.PrepareResult, len(work))
	for _, w := range work {
		out[w.claim.UID] = w.result
	}
	return out, nil
}

// prepareClaim runs the preparers of one claim and writes its CDI spec; on
// failure it undoes what it did and returns the error.
func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim, allocs []Allocation, devices map[string]slices.Entry) (ClaimRecord, error) {
	rec := ClaimRecord{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: ClaimCompleted, Allocations: allocs,
		CDISpec: d.opts.CDI.SpecName(string(claim.UID))}
	var cdiDevices []cdispec.Device
	for i, a := range allocs {
		start := time.Now()
		prepared, err := d.opts.Preparers[a.Kind].Prepare(ctx, a, devices[a.Device])
		d.opts.Metrics.observePrepare(a.Kind, err, time.Since(start))
		if err != nil {
			rec.Undo = append(rec.Undo, nil)
			if uerr := d.undo(ctx, rec); uerr != nil {
				err = fmt.Errorf("%w (and rolling back: %w: %v)", err, errUndoFailed, uerr)
			}
			return ClaimRecord{}, fmt.Errorf("device %s (request %s): %w", a.Device, a.Request, err)
		}
		rec.Undo = append(rec.Undo, prepared.Undo)
		crash.Point(fmt.Sprintf("prepare-device-%d", i))
		name := cdi.DeviceName(fmt.Sprintf("%s-%s-%s", claim.UID, a.Request, a.Device))
		if a.ShareID != nil {
			name = cdi.DeviceName(fmt.Sprintf("%s-%s-%s-%s", claim.UID, a.Request, a.Device, *a.ShareID))
		}
		edits := prepared.Edits
		edits.Env = append(standardEnv(a, claim.UID), edits.Env...)
		if cfg, err := DecodeEffectiveConfig(a.Config); err == nil {
			edits.Env = append(edits.Env, cfg.DeviceEnv()...)
		}
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{
			HostPath:      d.claimInfoPath(claim.UID),
			ContainerPath: filepath.Join(ClaimInfoDir, string(claim.UID)+".json"),
			Options:       []string{"ro", "bind"},
		})
		cdiDevices = append(cdiDevices, cdispec.Device{Name: name, ContainerEdits: edits})
		shareID := a.ShareID
		rec.Devices = append(rec.Devices, PreparedDevice{Request: a.Request, Pool: a.Pool, Device: a.Device, ShareID: shareID,
			CDIDeviceIDs: []string{d.opts.CDI.DeviceID(name)}, Network: prepared.Network})
	}
	if err := d.writeClaimInfo(rec); err != nil {
		return ClaimRecord{}, d.failAndUndo(ctx, rec, err)
	}
	if err := d.opts.CDI.Write(string(claim.UID), cdiDevices); err != nil {
		return ClaimRecord{}, d.failAndUndo(ctx, rec, err)
	}
	if d.opts.StatusClient != nil {
		// The status is for people and controllers to read; failing to
		// write it does not fail the pod.
		if err := d.opts.StatusClient.ReportDevices(ctx, d.opts.DriverName, claim, networkStatus(d.opts.DriverName, rec.Devices)); err != nil {
			klog.FromContext(ctx).Error(err, "Reporting network devices in the claim's status", "claim", klog.KObj(claim))
		}
	}
	rec.Updated = time.Now().UTC()
	return rec, nil
}

// errUndoFailed marks a failed preparation that could not be undone in full.
var errUndoFailed = errors.New("undo incomplete")

func (d *Driver) failAndUndo(ctx context.Context, rec ClaimRecord, err error) error {
	if uerr := d.undo(ctx, rec); uerr != nil {
		return fmt.Errorf("%w (and rolling back: %w: %v)", err, errUndoFailed, uerr)
	}
	return err
}

// allocations turns a claim's allocation into this driver's Allocations,
// checking everything before anything is applied: that each device exists
// here, that a preparer handles its kind, and that its configuration
// decodes and validates.
func (d *Driver) allocations(claim *resourceapi.ResourceClaim, devices map[string]slices.Entry) ([]Allocation, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	var out []Allocation
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue
		}
		entry, ok := devices[r.Device]
		if !ok {
			return nil, fmt.Errorf("device %q (request %s) is not a device of this node's pool", r.Device, r.Request)
		}
		if _, ok := d.opts.Preparers[entry.Kind]; !ok {
			return nil, fmt.Errorf("device %q (request %s) is a %s, which this agent cannot prepare", r.Device, r.Request, entry.Kind)
		}
		cfg, err := effectiveConfig(d.opts.DriverName, claim.Status.Allocation.Devices.Config, r.Request, entry.Kind)
		if err != nil {
			return nil, fmt.Errorf("device %q (request %s): %w", r.Device, r.Request, err)
		}
		a := Allocation{ClaimUID: claim.UID, ClaimNamespace: claim.Namespace, ClaimName: claim.Name, Request: r.Request,
			Pool: r.Pool, Device: r.Device, Kind: entry.Kind, ShareID: r.ShareID, Config: cfg}
		if len(r.ConsumedCapacity) > 0 {
			a.Consumed = r.ConsumedCapacity
		}
		out = append(out, a)
	}
	return out, nil
}

// recordStarted is phase 1 of PrepareResourceClaims.
func (d *Driver) recordStarted(ctx context.Context, work []*claimWork, devices map[string]slices.Entry) error {
	deadline := time.Now().Add(d.opts.ConflictWait)
	started := make(map[*claimWork]bool, len(work))
	for {
		var waiting []string
		var holders []types.UID
		err := d.opts.Checkpoint.Update(func(recs *Records) error {
			waiting, holders = waiting[:0], holders[:0]
			for _, w := range work {
				if started[w] {
					continue
				}
				if w.done {
					if w.rolledBack {
						recs.Delete(w.claim.UID)
					}
					continue
				}
				if err := checkConflicts(w.claim.UID, w.allocs, recs, devices); err != nil {
					var held *conflictError
					if errors.As(err, &held) && time.Now().Before(deadline) && ctx.Err() == nil {
						waiting, holders = append(waiting, err.Error()), append(holders, held.holders...)
						continue
					}
					w.result, w.done = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s: %w", klog.KObj(w.claim), err)}, true
					if w.rolledBack {
						recs.Delete(w.claim.UID)
					}
					continue
				}
				recs.Set(w.claim.UID, ClaimRecord{UID: w.claim.UID, Namespace: w.claim.Namespace, Name: w.claim.Name,
					State: ClaimStarted, Allocations: w.allocs, Updated: time.Now().UTC()})
				started[w] = true
			}
			return nil
		})
		if err != nil || len(waiting) == 0 {
			return err
		}
		klog.FromContext(ctx).V(2).Info("Waiting for another claim's record to go", "conflicts", waiting)
		if err := waitForGone(ctx, d.opts.Checkpoint, holders, deadline); err != nil {
			return err
		}
	}
}

// waitForGone polls, reading only, until a record of holders is gone, the
// deadline passes or ctx ends: the conflicts are checked again (and the
// checkpoint written) only once something may have changed.
func waitForGone(ctx context.Context, cp *Checkpoint, holders []types.UID, deadline time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		held, err := cp.Lookup(holders...)
		if err != nil {
			return err
		}
		if len(held) < len(uniqueUIDs(holders)) || !time.Now().Before(deadline) {
			return nil
		}
	}
}

func uniqueUIDs(uids []types.UID) map[types.UID]bool {
	out := make(map[types.UID]bool, len(uids))
	for _, u := range uids {
		out[u] = true
	}
	return out
}

// conflictError is a refusal of checkConflicts that another claim's
// unprepare may end.
type conflictError struct {
	error
	// holders are the claims whose records hold the device.
	holders []types.UID
}

func (e *conflictError) Unwrap() error { return e.error }

func claimUIDs(allocs []Allocation) []types.UID {
	out := make([]types.UID, 0, len(allocs))
	for _, a := range allocs {
		out = append(out, a.ClaimUID)
	}
	return out
}

// checkConflicts is the driver's last line of defence against a device
// given twice: an unshared device must not be prepared for another claim,
// and shares of a device must fit in its capacity. Only the other claims'
// allocations of the claim's own devices are gathered.
func checkConflicts(uid types.UID, allocs []Allocation, recs *Records, devices map[string]slices.Entry) error {
	byDevice := make(map[string][]Allocation, len(allocs))
	for _, a := range allocs {
		byDevice[a.Device] = nil
	}
	for other, rec := range recs.All() {
		if other == uid {
			continue
		}
		for _, a := range rec.Allocations {
			if others, ok := byDevice[a.Device]; ok {
				byDevice[a.Device] = append(others, a)
			}
		}
	}
	for _, a := range allocs {
		others := byDevice[a.Device]
		if a.ShareID == nil {
			if len(others) > 0 {
				return &conflictError{fmt.Errorf("device %s is already prepared for claim %s/%s", a.Device, others[0].ClaimNamespace, others[0].ClaimName), claimUIDs(others)}
			}
		} else {
			for _, o := range others {
				if o.ShareID == nil {
					return &conflictError{fmt.Errorf("device %s is already prepared whole for claim %s/%s", a.Device, o.ClaimNamespace, o.ClaimName), []types.UID{o.ClaimUID}}
				}
			}
			if err := CheckCapacity(devices[a.Device], a, others); err != nil {
				var over *OverCapacityError
				if errors.As(err, &over) {
					return &conflictError{err, claimUIDs(others)}
				}
				return err
			}
		}
		byDevice[a.Device] = append(byDevice[a.Device], a)
	}
	return nil
}

func resultFromRecord(rec ClaimRecord) kubeletplugin.PrepareResult {
	res := kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{}}
	for _, d := range rec.Devices {
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{d.Request}, PoolName: d.Pool,
			DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID})
	}
	return res
}

// networkStatus is the claim status entries (KEP-4817) of the devices that
// have network data.
func networkStatus(driver string, devices []PreparedDevice) []resourceapi.AllocatedDeviceStatus {
	var entries []resourceapi.AllocatedDeviceStatus
	for _, d := range devices {
		if d.Network == nil {
			continue
		}
		e := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: d.Pool, Device: d.Device, NetworkData: d.Network.DeepCopy()}
		if d.ShareID != nil {
			e.ShareID = ptr.To(string(*d.ShareID))
		}
		entries = append(entries, e)
	}
	return entries
}

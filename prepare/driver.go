package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/slices"
)

// ClaimInfoDir is where, inside a container, each claim's allocation is
// mounted as <claim uid>.json.
const ClaimInfoDir = "/run/carve/claims"

// Options configure a Driver.
type Options struct {
	DriverName string
	// StateDir holds the checkpoint and the per-claim info files. It must be
	// the same path on the host and in the agent's container, since CDI
	// mounts name host paths.
	StateDir   string
	Checkpoint *Checkpoint
	CDI        *CDIWriter
	// Preparers by device kind.
	Preparers map[string]Preparer
	// Devices returns the currently published devices by name.
	Devices func() map[string]slices.Entry
	Metrics *Metrics
	// StatusClient, when set, is used to report network devices in the
	// claims' status.devices.
	StatusClient StatusWriter
	// Health reports device health to the kubelet; nil means not supported.
	Health func(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error
	// Fatal is called with errors the helper reports as unrecoverable; the
	// agent cancels its context there. Never called from a goroutine to
	// exit the process itself.
	Fatal func(err error)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	opts Options
	// locks keep the preparation of a claim and its unpreparation from
	// overlapping within this process, while other claims go on; the
	// checkpoint's flock covers other processes.
	locks claimLocks
}

// claimLocks is a set of striped mutexes keyed by claim UID.
type claimLocks struct {
	stripes [64]sync.Mutex
}

// lock takes the stripes of all uids in a fixed order, so that two calls
// sharing claims cannot deadlock, and returns the unlock.
func (l *claimLocks) lock(uids []types.UID) func() {
	var idx []int
	seen := map[int]bool{}
	for _, u := range uids {
		h := fnv.New32a()
		h.Write([]byte(u))
		i := int(h.Sum32() % uint32(len(l.stripes)))
		if !seen[i] {
			seen[i] = true
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		l.stripes[i].Lock()
	}
	return func() {
		for j := len(idx) - 1; j >= 0; j-- {
			l.stripes[idx[j]].Unlock()
		}
	}
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// NewDriver checks the options and returns the plugin.
func NewDriver(opts Options) (*Driver, error) {
	if opts.DriverName == "" || opts.Checkpoint == nil || opts.CDI == nil || opts.Devices == nil || opts.StateDir == "" {
		return nil, errors.New("prepare: driver name, state dir, checkpoint, CDI writer and device source are required")
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "claims"), 0o755); err != nil {
		return nil, fmt.Errorf("create claim info directory: %w", err)
	}
	recs, err := opts.Checkpoint.Read()
	if err != nil {
		return nil, err
	}
	for kind, p := range opts.Preparers {
		r, ok := p.(Restorer)
		if !ok {
			continue
		}
		var allocs []Allocation
		var undo []json.RawMessage
		for _, rec := range recs {
			// Started claims too (with no undo yet): what they
			// made is still theirs until they are rolled back.
			for i, a := range rec.Allocations {
				if a.Kind != kind {
					continue
				}
				var u json.RawMessage
				if i < len(rec.Undo) {
					u = rec.Undo[i]
				}
				allocs, undo = append(allocs, a), append(undo, u)
			}
		}
		r.Restore(allocs, undo)
	}
	return &Driver{opts: opts}, nil
}

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
	records, err := d.opts.Checkpoint.Read()
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
	// device is used twice and no share exceeds its device.
	err = d.opts.Checkpoint.Update(func(recs map[types.UID]ClaimRecord) error {
		for _, w := range work {
			if w.done {
				if w.rolledBack {
					delete(recs, w.claim.UID)
				}
				continue
			}
			if err := checkConflicts(w.claim.UID, w.allocs, recs, devices); err != nil {
				w.result, w.done = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s: %w", klog.KObj(w.claim), err)}, true
				if w.rolledBack {
					delete(recs, w.claim.UID)
				}
				continue
			}
			recs[w.claim.UID] = ClaimRecord{UID: w.claim.UID, Namespace: w.claim.Namespace, Name: w.claim.Name,
				State: ClaimStarted, Allocations: w.allocs, Updated: time.Now().UTC()}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	crashPoint("prepare-started")

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
	crashPoint("prepare-cdi-written")

	// Phase 3: record completion, and drop the records of claims that
	// failed (they were rolled back).
	err = d.opts.Checkpoint.Update(func(recs map[types.UID]ClaimRecord) error {
		for _, w := range work {
			if w.done {
				continue
			}
			if rec, ok := completed[w.claim.UID]; ok {
				recs[w.claim.UID] = rec
			} else if !w.dirty {
				delete(recs, w.claim.UID)
			}
		}
		d.opts.Metrics.PreparedClaims.Set(float64(countCompleted(recs)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	crashPoint("prepare-completed")

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
		crashPoint(fmt.Sprintf("prepare-device-%d", i))
		name := cdiName(fmt.Sprintf("%s-%s-%s", claim.UID, a.Request, a.Device))
		if a.ShareID != nil {
			name = cdiName(fmt.Sprintf("%s-%s-%s-%s", claim.UID, a.Request, a.Device, *a.ShareID))
		}
		edits := prepared.Edits
		edits.Env = append(standardEnv(a, claim.UID), edits.Env...)
		if cfg, err := DecodeEffectiveConfig(a.Config); err == nil && cfg.Device != nil {
			edits.Env = append(edits.Env, cfg.Device.EnvList()...)
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
		if err := d.opts.StatusClient.ReportDevices(ctx, d.opts.DriverName, claim, rec.Devices); err != nil {
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

// standardEnv tells a container which device and share it got, by request:
// CARVE_<REQUEST>_DEVICE, _SHARE_ID, _CLAIM and one variable per consumed
// capacity, e.g. CARVE_NET_EGRESSBANDWIDTH=100M.
func standardEnv(a Allocation, claimUID types.UID) []string {
	prefix := a.EnvPrefix()
	env := []string{prefix + "DEVICE=" + a.Device, prefix + "KIND=" + a.Kind, prefix + "CLAIM=" + string(claimUID),
		prefix + "INFO=" + filepath.Join(ClaimInfoDir, string(claimUID)+".json")}
	if a.ShareID != nil {
		env = append(env, prefix+"SHARE_ID="+string(*a.ShareID))
	}
	names := make([]string, 0, len(a.Consumed))
	for n := range a.Consumed {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		q := a.Consumed[resourceapi.QualifiedName(n)]
		env = append(env, prefix+envToken(n)+"="+q.String())
	}
	return env
}

func envToken(s string) string {
	return strings.ToUpper(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s))
}

func (d *Driver) claimInfoPath(uid types.UID) string {
	return filepath.Join(d.opts.StateDir, "claims", string(uid)+".json")
}

// writeClaimInfo writes the file a claim's containers see at
// /run/carve/claims/<uid>.json: its devices, shares and capacities.
func (d *Driver) writeClaimInfo(rec ClaimRecord) error {
	type device struct {
		Request  string            `json:"request"`
		Device   string            `json:"device"`
		Kind     string            `json:"kind"`
		ShareID  *types.UID        `json:"shareID,omitempty"`
		Consumed map[string]string `json:"consumed,omitempty"`
	}
	info := struct {
		Claim   string   `json:"claim"`
		UID     string   `json:"uid"`
		Devices []device `json:"devices"`
	}{Claim: rec.Namespace + "/" + rec.Name, UID: string(rec.UID)}
	for _, a := range rec.Allocations {
		dv := device{Request: a.Request, Device: a.Device, Kind: a.Kind, ShareID: a.ShareID}
		for n, q := range a.Consumed {
			if dv.Consumed == nil {
				dv.Consumed = map[string]string{}
			}
			dv.Consumed[string(n)] = q.String()
		}
		info.Devices = append(info.Devices, dv)
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(d.claimInfoPath(rec.UID), b, 0o644)
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

// checkConflicts is the driver's last line of defence against a device
// given twice: an unshared device must not be prepared for another claim,
// and shares of a device must fit in its capacity.
func checkConflicts(uid types.UID, allocs []Allocation, recs map[types.UID]ClaimRecord, devices map[string]slices.Entry) error {
	byDevice := map[string][]Allocation{}
	for other, rec := range recs {
		if other == uid {
			continue
		}
		for _, a := range rec.Allocations {
			byDevice[a.Device] = append(byDevice[a.Device], a)
		}
	}
	for _, a := range allocs {
		others := byDevice[a.Device]
		if a.ShareID == nil {
			if len(others) > 0 {
				return fmt.Errorf("device %s is already prepared for claim %s/%s", a.Device, others[0].ClaimNamespace, others[0].ClaimName)
			}
		} else {
			for _, o := range others {
				if o.ShareID == nil {
					return fmt.Errorf("device %s is already prepared whole for claim %s/%s", a.Device, o.ClaimNamespace, o.ClaimName)
				}
			}
			if err := CheckCapacity(devices[a.Device], a, others); err != nil {
				return err
			}
		}
		byDevice[a.Device] = append(byDevice[a.Device], a)
	}
	return nil
}

// UnprepareResourceClaims undoes claims; a claim this agent does not know is
// already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	uids := make([]types.UID, len(claims))
	for i, c := range claims {
		uids[i] = c.UID
	}
	defer d.locks.lock(uids)()
	records, err := d.opts.Checkpoint.Read()
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		rec, ok := records[c.UID]
		if !ok {
			out[c.UID] = nil
			continue
		}
		if err := d.undo(ctx, rec); err != nil {
			klog.FromContext(ctx).Error(err, "Unprepare failed; the kubelet will retry", "claim", c.NamespacedName)
			out[c.UID] = fmt.Errorf("unprepare claim %s: %w", c.NamespacedName, err)
			continue
		}
		crashPoint("unprepare-undone")
		// Every claim needs an entry: the kubelet takes a missing one
		// for a claim the driver skipped, and retries.
		out[c.UID] = nil
		if err := d.opts.Checkpoint.Update(func(recs map[types.UID]ClaimRecord) error {
			delete(recs, c.UID)
			d.opts.Metrics.PreparedClaims.Set(float64(countCompleted(recs)))
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
		crashPoint(fmt.Sprintf("unprepare-device-%d", i))
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

func resultFromRecord(rec ClaimRecord) kubeletplugin.PrepareResult {
	res := kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{}}
	for _, d := range rec.Devices {
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{d.Request}, PoolName: d.Pool,
			DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID})
	}
	return res
}

func countCompleted(recs map[types.UID]ClaimRecord) int {
	n := 0
	for _, r := range recs {
		if r.State == ClaimCompleted {
			n++
		}
	}
	return n
}

// HandleError is called by the helper for background errors, such as a
// failed publish. Recoverable ones are logged and counted; fatal ones stop
// the agent through its context, never by exiting from a goroutine.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.opts.Metrics.PublishErrors.Inc()
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.opts.Fatal != nil {
		d.opts.Fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus streams device health where the agent can observe it.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.opts.Health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.opts.Health(ctx, reports)
}

package prep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/crash"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// Options is where the GPU preparer finds the host's driver.
type Options struct {
	// NVML is the node's NVML session; nil where the node has none, and
	// then every GPU claim is refused saying so.
	NVML *gpu.Session
	// Root is the host root: /dev and /proc/driver/nvidia are below it.
	Root string
	// DriverRoot is where the driver's libraries and binaries are
	// installed on the host: "/" for a distribution's packages,
	// /usr/local/nvidia (lib64, bin) on some hosts. Files are found below
	// it, never assumed.
	DriverRoot string
	// CDIHookPath is nvidia-cdi-hook (nvidia-ctk's hooks) where the host
	// has it; without it the hooks are off and carve mounts the libraries'
	// soname links and sets LD_LIBRARY_PATH itself.
	CDIHookPath string
	// Shares prepares GPU memory slices; nil where none are offered.
	Shares *memslice.Manager
	// StateDir is the agent's state directory, where each MIG instance
	// carve makes is recorded beside the checkpoint (records.go); empty
	// records nothing, and a lost checkpoint then leaks its instances.
	StateDir string
	Logger   logr.Logger
}

// Preparer prepares the kinds gpu and mig.
type Preparer struct {
	opts Options
	// Devices finds a published device by name; the agent sets it once
	// its inventory exists, for Restore to resolve claims not completed.
	Devices func() map[string]slices.Entry

	// uvmUnloaded is set once the agent has said the nvidia-uvm module
	// is not loaded: said once, not at every prepare.
	uvmUnloaded atomic.Bool

	mu      sync.Mutex
	unowned []string
	// owned are the GPU instances claims made (instanceKey), each with
	// its claim, known once Restore has read the checkpoint and the
	// node's records (restored).
	owned    map[string]types.UID
	restored bool
	// contested are recorded instances that two claims' records name and
	// the checkpoint does not settle: their placements stay taken, and
	// neither claim's unprepare destroys them.
	contested map[string]bool
}

// OwnsInstance tells whether a claim made the GPU instance of this
// profile Id at this placement start on GPU uuid (slices.MIGOwned). Until
// Restore has read the checkpoint every instance may be a claim's, and is
// taken as one.
func (p *Preparer) OwnsInstance(uuid string, profileID, start int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := instanceKey(uuid, profileID, start)
	_, owned := p.owned[key]
	return !p.restored || owned || p.contested[key]
}

// own records an instance a claim makes.
func (p *Preparer) own(rec migRecord, claim types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owned == nil {
		p.owned = map[string]types.UID{}
	}
	p.owned[rec.key()] = claim
}

// heldByOther says which other claim than this one holds the record's
// instance, where one does (or two claims' records name it).
func (p *Preparer) heldByOther(rec migRecord, claim types.UID) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.contested[rec.key()] {
		return "the records of two claims the checkpoint does not know", true
	}
	owner, ok := p.owned[rec.key()]
	if !ok || owner == claim {
		return "", false
	}
	return "claim " + string(owner), true
}

// forget drops an instance that is gone, or was never made.
func (p *Preparer) forget(rec migRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.owned, rec.key())
	delete(p.contested, rec.key())
}

var (
	_ prepare.Preparer     = (*Preparer)(nil)
	_ prepare.Restorer     = (*Preparer)(nil)
	_ prepare.ClaimCleaner = (*Preparer)(nil)
)

// New returns the GPU preparer.
func New(opts Options) *Preparer {
	if opts.Root == "" {
		opts.Root = "/"
	}
	if opts.DriverRoot == "" {
		opts.DriverRoot = opts.Root
	}
	return &Preparer{opts: opts}
}

// crashPoint is a fault point of the crash matrix between two steps of a
// MIG instance's making or destroying (crash.Point); tests replace it with
// one that ends the calling goroutine, as a killed agent ends.
var crashPoint = crash.Point

var errNoNVML = errors.New("this node has no working NVML")

// Prepare gives the container a whole GPU, or creates a MIG partition at
// the allocated placement and gives it that.
func (p *Preparer) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.GPU == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not a GPU or MIG device", a.Device)
	}
	if p.opts.NVML == nil {
		return prepare.Prepared{}, fmt.Errorf("GPU %s: %w", a.Device, errNoNVML)
	}
	if a.ShareID != nil {
		return p.prepareShare(ctx, a, dev)
	}
	if dev.GPU.MIG != nil {
		return p.prepareMIG(ctx, a, *dev.GPU)
	}
	edits, err := p.wholeGPUEdits(ctx, dev.GPU.Device)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("GPU %s: %w", a.Device, err)
	}
	edits.Env = append(edits.Env, a.EnvPrefix()+"GPU_UUID="+dev.GPU.Device.UUID)
	return prepare.Prepared{Edits: edits}, nil
}

// Unprepare destroys the MIG partition an allocation made, or takes a
// memory share back; a whole GPU has nothing on the host to undo.
func (p *Preparer) Unprepare(ctx context.Context, a prepare.Allocation, undo json.RawMessage) error {
	if a.Kind == names.KindGPU && a.ShareID != nil {
		return p.unprepareShare(ctx, a, undo)
	}
	if a.Kind != names.KindMIG {
		return nil
	}
	var rec migRecord
	// The GPU instance's id, where known: only the instance with it is
	// destroyed. The one at the placement may be another's by now (the
	// claim's destroyed by hand or by a reset, another made there), and
	// destroying whatever sat at the placement took it from its owner.
	var wantGI *uint32
	if len(undo) > 0 {
		if err := json.Unmarshal(undo, &rec); err != nil {
			return fmt.Errorf("MIG device %s: undo record: %w", a.Device, err)
		}
		// Written once the instance was made, with its ids.
		wantGI = &rec.GPUInstanceID
	} else if node, ok := p.nodeRecordOf(a.ClaimUID, a.Device); ok {
		// A crash before Prepare returned: the node's record, written
		// before the instance, names it; its ids once it was made.
		rec = node.Instance
		if node.IDsKnown {
			wantGI = &rec.GPUInstanceID
		}
	} else {
		// Or, where records are not kept, the published device, which
		// the counters gave this claim alone.
		e, ok := p.lookup(a.Device)
		if !ok || e.GPU == nil || e.GPU.MIG == nil {
			return fmt.Errorf("MIG device %s: no undo record and the device is no longer published; cannot find its instance", a.Device)
		}
		rec = recordFor(*e.GPU)
	}
	if p.opts.NVML == nil {
		return fmt.Errorf("MIG device %s: %w", a.Device, errNoNVML)
	}
	if err := p.destroyMIG(ctx, a.Device, rec, wantGI); err != nil {
		return err
	}
	// The node's record goes last: a crash before this finds it, and
	// destroys nothing more (the instance is gone) before removing it.
	crashPoint("mig-destroyed")
	return p.removeNodeRecord(a.ClaimUID, a.Device)
}

func (p *Preparer) lookup(name string) (slices.Entry, bool) {
	if p.Devices == nil {
		return slices.Entry{}, false
	}
	e, ok := p.Devices()[name]
	return e, ok
}

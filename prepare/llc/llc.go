package llc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// Options configure the LLC preparer.
type Options struct {
	// FS is resctrl as the agent sees it (under its root); nil where the
	// node has none, and then only whole caches are prepared.
	FS resctrl.FS
	// HostDir is resctrl's mount point on the host, which the hook,
	// run by the container runtime on the host, writes to.
	HostDir string
	// HookPath is the hook binary the runtime runs; HookArgs its argv up
	// to the hook's flags (default: ["carve", "hook", "resctrl-attach"]).
	HookPath string
	HookArgs []string
	// StateDir, where set, keeps a record of each share on the node
	// (records.go): what a lost checkpoint is rebuilt from.
	StateDir string
}

// Preparer prepares whole caches and way shares. It keeps the shares'
// masks in memory, restored from the checkpoint at start.
type Preparer struct {
	opts  Options
	mu    sync.Mutex
	alloc *allocator
	// restoreErrs are what Restore could not take back; they are logged
	// at the next call that has a logger.
	restoreErrs []error
}

var (
	_ prepare.Preparer = (*Preparer)(nil)
	_ prepare.Restorer = (*Preparer)(nil)
)

// New returns an LLC preparer.
func New(opts Options) *Preparer {
	if opts.HostDir == "" {
		opts.HostDir = "/sys/fs/resctrl"
	}
	return &Preparer{opts: opts, alloc: newAllocator()}
}

// GroupName is the resctrl group (and OCI closID) of a share, derived from
// its key so that a crash halfway can be undone from the allocation alone.
func GroupName(shareKey string) string {
	sum := sha256.Sum256([]byte(shareKey))
	return "carve-" + hex.EncodeToString(sum[:8])
}

// Prepare describes a whole cache, or gives a share its ways.
func (p *Preparer) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.LLC == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not an LLC", a.Device)
	}
	edits := cdispec.ContainerEdits{Env: []string{
		a.EnvPrefix() + "CACHE_ID=" + strconv.Itoa(dev.LLC.ID),
		a.EnvPrefix() + "CPUS=" + dev.LLC.CPUs,
	}}
	if a.ShareID == nil {
		return prepare.Prepared{Edits: edits}, nil
	}
	if p.opts.FS == nil || dev.LLC.Resctrl == nil {
		return prepare.Prepared{}, fmt.Errorf("LLC %s: a share needs resctrl, which this node has not mounted", a.Device)
	}
	want, err := shareWays(a, *dev.LLC)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("LLC %s: %w", a.Device, err)
	}
	mb, err := quantityInt(a.Consumed, names.CapMemoryBandwidth)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("LLC %s: %w", a.Device, err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.logRestoreErrors(ctx)
	s, err := p.place(a.ShareKey(), dev.LLC.ID, want, mb)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("LLC %s: %w", a.Device, err)
	}
	undo, _ := json.Marshal(s)
	schema := resctrl.L3Line(map[int]uint64{s.Domain: s.Mask})
	rdt := &cdispec.IntelRdt{ClosID: s.Group, L3CacheSchema: schema}
	if s.MB > 0 {
		rdt.MemBwSchema = resctrl.MBLine(s.Domain, s.MB)
	}
	edits.IntelRdt = rdt
	edits.Env = append(edits.Env,
		a.EnvPrefix()+"CACHE_WAYS="+strconv.Itoa(ways(s.Mask)),
		a.EnvPrefix()+"CACHE_MASK="+strconv.FormatUint(s.Mask, 16),
		a.EnvPrefix()+"CLOS_ID="+s.Group)
	edits.Hooks = []*cdispec.Hook{{HookName: "createRuntime", Path: p.opts.HookPath,
		Args: append(p.hookArgs(), "--resctrl", p.opts.HostDir, "--group", s.Group)}}
	return prepare.Prepared{Edits: edits, Undo: undo}, nil
}

// place allocates (or, prepared again, finds) a share's ways and makes its
// group; on failure nothing of it is left.
func (p *Preparer) place(key string, domain, want, mb int) (share, error) {
	in, err := resctrl.ReadL3Info(p.opts.FS)
	if err != nil {
		return share{}, err
	}
	s, ok := p.alloc.shares[key]
	if !ok {
		mask, err := p.alloc.place(in, domain, want)
		if err != nil {
			return share{}, err
		}
		s = share{Group: GroupName(key), Domain: domain, Mask: mask}
		if mb > 0 {
			if s.MB, err = p.bandwidth(mb); err != nil {
				return share{}, err
			}
		}
		if err := p.alloc.add(key, s); err != nil {
			return share{}, err
		}
		if err := p.writeRecord(key, s); err != nil {
			delete(p.alloc.shares, key)
			return share{}, err
		}
	}
	if err := p.apply(in, s); err != nil {
		err = fmt.Errorf("share %s (ways %x of cache domain %d): %w", s.Group, s.Mask, s.Domain, err)
		if uerr := p.remove(key, s); uerr != nil {
			return share{}, fmt.Errorf("%w (and removing it: %v)", err, uerr)
		}
		return share{}, err
	}
	return s, nil
}

// Unprepare removes a share's group, frees its ways and gives them back to
// the default group.
func (p *Preparer) Unprepare(ctx context.Context, a prepare.Allocation, undo json.RawMessage) error {
	if a.ShareID == nil || p.opts.FS == nil {
		return nil
	}
	key := a.ShareKey()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logRestoreErrors(ctx)
	s, ok := p.alloc.shares[key]
	if !ok && len(undo) > 0 {
		if err := json.Unmarshal(undo, &s); err != nil {
			return fmt.Errorf("LLC %s: undo record: %w", a.Device, err)
		}
		ok = true
	}
	if !ok {
		// A crash before the record: the group, if it was made, is
		// found by its name; every domain's default is redone.
		s = share{Group: GroupName(key), Domain: -1}
	}
	if err := p.remove(key, s); err != nil {
		return fmt.Errorf("LLC %s: %w", a.Device, err)
	}
	return nil
}

// remove deletes a share's group and frees its ways, then gives them back
// to the default group (all domains where the share's is unknown).
func (p *Preparer) remove(key string, s share) error {
	if err := p.opts.FS.Remove(s.Group); err != nil {
		return err
	}
	if err := p.removeRecord(s.Group); err != nil {
		return err
	}
	delete(p.alloc.shares, key)
	in, err := resctrl.ReadL3Info(p.opts.FS)
	if err != nil {
		return err
	}
	domains := []int{s.Domain}
	if s.Domain < 0 {
		if domains, err = p.domains(); err != nil {
			return err
		}
	}
	for _, d := range domains {
		if err := p.applyDefault(in, d); err != nil {
			return err
		}
	}
	return nil
}

// shareWays is the ways a share consumes: its ways capacity, or enough
// ways for its size where that asks for more.
func shareWays(a prepare.Allocation, l discovery.LLC) (int, error) {
	n, err := quantityInt(a.Consumed, names.CapWays)
	if err != nil {
		return 0, err
	}
	if size, ok := a.Consumed[names.CapSize]; ok && l.Resctrl != nil && l.SizeBytes > 0 {
		total := discovery.MaskWays(l.Resctrl.CBMMask)
		wayBytes := l.SizeBytes / int64(max(total, 1))
		if need := int((size.Value() + wayBytes - 1) / wayBytes); need > n {
			n = need
		}
	}
	if n <= 0 {
		return 0, errors.New("the share consumes no ways")
	}
	return n, nil
}

func quantityInt(consumed map[resourceapi.QualifiedName]resource.Quantity, name resourceapi.QualifiedName) (int, error) {
	q, ok := consumed[name]
	if !ok {
		return 0, nil
	}
	v, ok := q.AsInt64()
	if !ok || v < 0 || v > 1<<20 {
		return 0, fmt.Errorf("consumed %s %s is not a small whole number", name, q.String())
	}
	return int(v), nil
}

// isExist tells a group that is already there, as after a crash.
func isExist(err error) bool { return errors.Is(err, fs.ErrExist) }

// isNoSpace tells that resctrl has no CLOSID left.
func isNoSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) }

func (p *Preparer) hookArgs() []string {
	if len(p.opts.HookArgs) > 0 {
		return append([]string(nil), p.opts.HookArgs...)
	}
	return []string{"carve", "hook", "resctrl-attach"}
}

package llc

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery/cbm"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

// Restore takes back the shares of the checkpoint: from their undo records,
// or, for claims that crashed before their record, from their groups'
// schemata where the groups were made (their domain from the device name,
// llc-<cache id>), so that no new share is given their ways before they
// are rolled back. Then the shares recorded on the node that the
// checkpoint does not hold (it was lost or corrupt) are adopted where their
// groups still exist (records.go): a lost checkpoint never gives away the
// ways of shares that run.
func (p *Preparer) Restore(allocs []prepare.Allocation, undo []json.RawMessage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, a := range allocs {
		if a.ShareID == nil {
			continue
		}
		var s share
		if i < len(undo) && len(undo[i]) > 0 {
			if err := json.Unmarshal(undo[i], &s); err != nil {
				p.restoreErrs = append(p.restoreErrs, fmt.Errorf("LLC %s share %s: undo record: %w", a.Device, a.ShareKey(), err))
				continue
			}
		} else if p.opts.FS != nil {
			var ok bool
			if s, ok = p.groupOnHost(a); !ok {
				continue
			}
		} else {
			continue
		}
		if err := p.alloc.add(a.ShareKey(), s); err != nil {
			p.restoreErrs = append(p.restoreErrs, fmt.Errorf("LLC %s: restoring: %w", a.Device, err))
		}
	}
	if p.opts.FS != nil {
		p.adoptRecorded()
	}
}

// groupOnHost reads the mask of a share whose preparation did not finish.
func (p *Preparer) groupOnHost(a prepare.Allocation) (share, bool) {
	var domain int
	if _, err := fmt.Sscanf(a.Device, "llc-%d", &domain); err != nil {
		return share{}, false
	}
	g := GroupName(a.ShareKey())
	b, err := p.opts.FS.ReadFile(path.Join(g, "schemata"))
	if err != nil {
		return share{}, false
	}
	sch, err := resctrl.ParseSchemata(string(b))
	if err != nil {
		return share{}, false
	}
	mask, err := sch.Mask(domain)
	if err != nil || !cbm.Contiguous(mask) {
		return share{}, false
	}
	return share{Group: g, Domain: domain, Mask: mask}, true
}

func (p *Preparer) logRestoreErrors(ctx context.Context) {
	if len(p.restoreErrs) == 0 {
		return
	}
	var msgs []string
	for _, err := range p.restoreErrs {
		msgs = append(msgs, err.Error())
	}
	klog.FromContext(ctx).Error(nil, "LLC shares the checkpoint holds that could not be taken back", "errors", strings.Join(msgs, "; "))
	p.restoreErrs = nil
}

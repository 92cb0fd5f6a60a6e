package llc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Each share is also recorded on the node, where Options.StateDir is set:
//
//	<state-dir>/llc/<group>.json   {"key": ..., "claimUID": ..., "share": {group, domain, mask, mb}}
//
// written before its group is made and removed after the group is. The
// checkpoint's undo records stay the truth while it is readable; these are
// what a lost or corrupt checkpoint is rebuilt from: Restore adopts a
// recorded share whose group still exists, so that its ways are given to no
// one else and its tasks keep them, and the kubelet's unprepare of a claim
// the checkpoint does not know finds its shares by the claim's UID
// (UnprepareClaim). Group names are hashes of share keys, which a claim's
// UID alone does not give, hence the record.
const recordsDir = "llc"

type record struct {
	Key      string    `json:"key"`
	ClaimUID types.UID `json:"claimUID"`
	Share    share     `json:"share"`
}

var _ prepare.ClaimCleaner = (*Preparer)(nil)

func (p *Preparer) recordPath(group string) string {
	return filepath.Join(p.opts.StateDir, recordsDir, group+".json")
}

// writeRecord records a share before its group is made.
func (p *Preparer) writeRecord(key string, s share) error {
	if p.opts.StateDir == "" {
		return nil
	}
	claim, _, _ := strings.Cut(key, "/") // ShareKey: "<claim uid>/<request>/<share id>"
	data, err := json.Marshal(record{Key: key, ClaimUID: types.UID(claim), Share: s})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.recordPath(s.Group)), 0o700); err != nil {
		return fmt.Errorf("LLC share records: %w", err)
	}
	if err := atomicfile.Write(p.recordPath(s.Group), data, 0o600); err != nil {
		return fmt.Errorf("record LLC share %s: %w", key, err)
	}
	return nil
}

// removeRecord removes a share's record once its group is gone.
func (p *Preparer) removeRecord(group string) error {
	if p.opts.StateDir == "" {
		return nil
	}
	if err := os.Remove(p.recordPath(group)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the record of LLC group %s: %w", group, err)
	}
	return nil
}

// records reads every share record on the node. One that cannot be read, or
// whose group is not its key's, is reported and left alone.
func (p *Preparer) records() ([]record, []error) {
	if p.opts.StateDir == "" {
		return nil, nil
	}
	files, err := filepath.Glob(filepath.Join(p.opts.StateDir, recordsDir, "*.json"))
	if err != nil {
		return nil, []error{err}
	}
	var out []record
	var errs []error
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r record
		if err := json.Unmarshal(raw, &r); err != nil {
			errs = append(errs, fmt.Errorf("LLC share record %s: %w", f, err))
			continue
		}
		if r.Share.Group != GroupName(r.Key) || filepath.Base(f) != r.Share.Group+".json" || !strings.HasPrefix(r.Key, string(r.ClaimUID)+"/") {
			errs = append(errs, fmt.Errorf("LLC share record %s: group %s is not its share %s's", f, r.Share.Group, r.Key))
			continue
		}
		out = append(out, r)
	}
	return out, errs
}

// adoptRecorded, at Restore with p.mu held, takes back the recorded shares
// the checkpoint does not hold and whose groups still exist; a record whose
// group was never made (a crash between the two) is removed.
func (p *Preparer) adoptRecorded() {
	recs, errs := p.records()
	p.restoreErrs = append(p.restoreErrs, errs...)
	logger := klog.FromContext(context.Background())
	for _, r := range recs {
		if _, ok := p.alloc.shares[r.Key]; ok {
			continue
		}
		if _, err := p.opts.FS.ReadFile(path.Join(r.Share.Group, "schemata")); errors.Is(err, os.ErrNotExist) {
			if err := p.removeRecord(r.Share.Group); err != nil {
				p.restoreErrs = append(p.restoreErrs, err)
			}
			continue
		}
		if err := p.alloc.add(r.Key, r.Share); err != nil {
			p.restoreErrs = append(p.restoreErrs, fmt.Errorf("LLC share %s recorded on the node: %w", r.Key, err))
			continue
		}
		logger.Info("Adopting an LLC share recorded on the node that the checkpoint does not hold; its ways stay its own until its claim is unprepared",
			"claimUID", r.ClaimUID, "share", r.Key, "group", r.Share.Group, "domain", r.Share.Domain, "mask", fmt.Sprintf("%x", r.Share.Mask))
	}
}

// UnprepareClaim removes the shares of a claim the checkpoint does not know
// (lost or corrupt): those Restore adopted and any other recorded for it.
func (p *Preparer) UnprepareClaim(ctx context.Context, claim types.UID) error {
	if p.opts.FS == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logRestoreErrors(ctx)
	todo := map[string]share{}
	for key, s := range p.alloc.shares {
		if strings.HasPrefix(key, string(claim)+"/") {
			todo[key] = s
		}
	}
	recs, _ := p.records()
	for _, r := range recs {
		if r.ClaimUID == claim {
			if _, ok := todo[r.Key]; !ok {
				todo[r.Key] = r.Share
			}
		}
	}
	var errs []error
	for key, s := range todo {
		klog.FromContext(ctx).Info("Removing an LLC share the checkpoint does not know", "claimUID", claim, "share", key, "group", s.Group)
		if err := p.remove(key, s); err != nil {
			errs = append(errs, fmt.Errorf("LLC share %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

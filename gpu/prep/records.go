package prep

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Each MIG instance carve makes is also recorded on the node, where
// Options.StateDir is set:
//
//	<state-dir>/mig/<claim id>/<device>.json   {"claimUID", "device", "instance": migRecord, "idsKnown"}
//
// written before the instance is made (and again once its GPU and compute
// instance ids are known), and removed after it is destroyed. The
// checkpoint's undo records stay the truth while it is readable; these are
// what a lost or corrupt checkpoint is rebuilt from: Restore adopts a
// recorded instance the checkpoint does not hold, so that its placement is
// given to no one else and it is not reported as unowned, and the kubelet's
// unprepare of a claim the checkpoint does not know finds its instances by
// the claim's derived directory (UnprepareClaim) and destroys them. Without
// the record the instance would be known only from the checkpoint, and a
// lost checkpoint would leak it until someone removed it by hand.
const migRecordsDir = "mig"

// nodeRecord is a MIG instance's record on the node.
type nodeRecord struct {
	ClaimUID types.UID `json:"claimUID"`
	Device   string    `json:"device"`
	Instance migRecord `json:"instance"`
	// IDsKnown tells that Instance's GPU and compute instance ids are
	// the instance's: false in the record written before it was made.
	IDsKnown bool `json:"idsKnown"`
}

// claimRecordsDir is a claim's directory of MIG records. The claim's UID is
// hashed: it is the API server's string, not a name carve chose, and must
// not be able to name another path.
func (p *Preparer) claimRecordsDir(claim types.UID) string {
	h := sha256.Sum256([]byte(claim))
	return filepath.Join(p.opts.StateDir, migRecordsDir, hex.EncodeToString(h[:])[:16])
}

// recordPath is where the record of a claim's instance on a device lives.
// Device names are carve's own DNS labels; anything else cannot be a file
// name here and is refused.
func (p *Preparer) recordPath(claim types.UID, device string) (string, error) {
	if errs := validation.IsDNS1123Label(device); len(errs) > 0 {
		return "", fmt.Errorf("MIG device name %q cannot name its record: %s", device, strings.Join(errs, "; "))
	}
	return filepath.Join(p.claimRecordsDir(claim), device+".json"), nil
}

// recording tells whether MIG instances are recorded on the node.
func (p *Preparer) recording() bool { return p.opts.StateDir != "" }

// writeNodeRecord records a claim's instance, durably: a crash right after
// must find it.
func (p *Preparer) writeNodeRecord(r nodeRecord) error {
	if !p.recording() {
		return nil
	}
	path, err := p.recordPath(r.ClaimUID, r.Device)
	if err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("MIG device %s: encode its node record: %w", r.Device, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("MIG device %s: claim %s: node records: %w", r.Device, r.ClaimUID, err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("MIG device %s: claim %s: record its instance: %w", r.Device, r.ClaimUID, err)
	}
	return nil
}

// nodeRecordExists tells whether a claim's instance on a device is
// recorded; an unreadable directory counts as recorded, so that nothing is
// removed on a guess.
func (p *Preparer) nodeRecordExists(claim types.UID, device string) bool {
	path, err := p.recordPath(claim, device)
	if err != nil || !p.recording() {
		return false
	}
	_, err = os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// removeNodeRecord removes a claim's instance record once the instance is
// gone, and the claim's directory once it holds no record; a record
// already gone is no error.
func (p *Preparer) removeNodeRecord(claim types.UID, device string) error {
	if !p.recording() {
		return nil
	}
	path, err := p.recordPath(claim, device)
	if err != nil {
		return nil // a name that cannot name a record was never recorded
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("MIG device %s: claim %s: remove its node record: %w", device, claim, err)
	}
	// Another record of the claim keeps the directory: ENOTEMPTY is the
	// expected answer then, not a failure.
	_ = os.Remove(filepath.Dir(path))
	return nil
}

// readNodeRecords reads the records below dir: every claim's where dir is
// the records' root, one claim's where it is that claim's directory. A
// record that cannot be read, or that does not belong where it was found
// (its claim and device derive another path), is reported and never acted
// on: a copied or planted file must not make the agent adopt or destroy
// another claim's instance.
func (p *Preparer) readNodeRecords(claim *types.UID) ([]nodeRecord, []error) {
	if !p.recording() {
		return nil, nil
	}
	pattern := filepath.Join(p.opts.StateDir, migRecordsDir, "*", "*.json")
	if claim != nil {
		pattern = filepath.Join(p.claimRecordsDir(*claim), "*.json")
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, []error{fmt.Errorf("MIG node records: %w", err)}
	}
	var out []nodeRecord
	var errs []error
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("MIG node record: %w", err))
			continue
		}
		var r nodeRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			errs = append(errs, fmt.Errorf("MIG node record %s: %w", f, err))
			continue
		}
		if want, err := p.recordPath(r.ClaimUID, r.Device); err != nil || want != f || r.ClaimUID == "" {
			errs = append(errs, fmt.Errorf("MIG node record %s: its instance (device %q of claim %q) is not this file's; left alone", f, r.Device, r.ClaimUID))
			continue
		}
		if r.Instance.ParentUUID == "" || r.Instance.PlacementSize == 0 {
			errs = append(errs, fmt.Errorf("MIG node record %s: no parent GPU or placement", f))
			continue
		}
		out = append(out, r)
	}
	return out, errs
}

// nodeRecordOf is the record of a claim's instance on a device, where one
// is on the node and belongs where it is.
func (p *Preparer) nodeRecordOf(claim types.UID, device string) (nodeRecord, bool) {
	recs, _ := p.readNodeRecords(&claim)
	for _, r := range recs {
		if r.ClaimUID == claim && r.Device == device {
			return r, true
		}
	}
	return nodeRecord{}, false
}

package memslice

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Each share is also recorded on the node, beside its claim's daemon:
//
//	<Dir>/mps/<claim id>/<gpu id>/share-<share key as a file name>.json
//
// written before the daemon is set up for it and removed when it is taken
// back. The checkpoint stays the truth while it is readable; these records
// are what a lost or corrupt checkpoint is rebuilt from (Restore adopts a
// recorded share the checkpoint does not hold, and keeps it enforced), and
// what the kubelet's unprepare of a claim the checkpoint lost finds by the
// claim's derived directory (UnprepareClaim).
const shareFilePrefix = "share-"

// shareFile is a share's record on the node: every field of its Request.
type shareFile struct {
	Key       string    `json:"key"`
	ClaimUID  types.UID `json:"claimUID"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	ShareID   string    `json:"shareID"`
	UUID      string    `json:"uuid"`
	Slice     uint64    `json:"sliceBytes"`
	Tier      Tier      `json:"tier"`
	Region    string    `json:"region,omitempty"`
	EnvPrefix string    `json:"envPrefix"`
	ShmSize   uint64    `json:"shmSizeBytes,omitempty"`
}

func shareFileName(key string) string { return shareFilePrefix + fileName(key) + ".json" }

// writeShareFile records a share in its daemon directory.
func writeShareFile(daemonDir string, r Request) error {
	data, err := json.Marshal(shareFile{Key: r.Key, ClaimUID: r.ClaimUID, Namespace: r.Namespace, Name: r.Name, ShareID: r.ShareID,
		UUID: r.UUID, Slice: r.Slice, Tier: r.Choice.Tier, Region: r.Choice.Region, EnvPrefix: r.EnvPrefix, ShmSize: r.ShmSize})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(daemonDir, shareFileName(r.Key)), data, 0o644); err != nil {
		return fmt.Errorf("GPU %s: claim %s: record share %s: %w", r.UUID, r.ClaimUID, r.Key, err)
	}
	return nil
}

// removeShareFile removes a share's record; one already gone is no error.
func removeShareFile(daemonDir, key string) error {
	if err := os.Remove(filepath.Join(daemonDir, shareFileName(key))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("GPU share %s: remove its record: %w", key, err)
	}
	return nil
}

// daemonOnNode is a claim daemon's directory as found on the node: its
// owner record and the shares recorded in it.
type daemonOnNode struct {
	dir    string
	owner  owner
	shares []Request
	// bad are records that could not be read: kept, and reported.
	bad []error
}

// readDaemon reads a daemon directory's owner and share records. A record
// whose share does not belong to this directory (its claim or GPU derive
// another) is refused: a copied or planted file must not make the agent
// adopt, police or stop another claim's share.
func (m *Manager) readDaemon(dir string) daemonOnNode {
	d := daemonOnNode{dir: dir}
	if raw, err := os.ReadFile(filepath.Join(dir, ownerFile)); err == nil {
		if err := json.Unmarshal(raw, &d.owner); err != nil {
			d.bad = append(d.bad, fmt.Errorf("%s: %w", filepath.Join(dir, ownerFile), err))
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		d.bad = append(d.bad, err)
		return d
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), shareFilePrefix) || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		raw, err := os.ReadFile(path)
		if err != nil {
			d.bad = append(d.bad, err)
			continue
		}
		var f shareFile
		if err := json.Unmarshal(raw, &f); err != nil {
			d.bad = append(d.bad, fmt.Errorf("%s: %w", path, err))
			continue
		}
		switch {
		case f.Key == "" || f.UUID == "" || f.Slice == 0:
			d.bad = append(d.bad, fmt.Errorf("%s: a share record without its key, GPU or slice", path))
			continue
		case DaemonDir(m.opts.Dir, f.ClaimUID, f.UUID) != dir || shareFileName(f.Key) != e.Name():
			d.bad = append(d.bad, fmt.Errorf("%s: its share (%s of claim %s on GPU %s) is not this directory's", path, f.Key, f.ClaimUID, f.UUID))
			continue
		case f.Tier != TierMPSPoliced && f.Tier != TierDMEM:
			d.bad = append(d.bad, fmt.Errorf("%s: tier %q", path, f.Tier))
			continue
		}
		d.shares = append(d.shares, Request{Key: f.Key, ClaimUID: f.ClaimUID, Namespace: f.Namespace, Name: f.Name, ShareID: f.ShareID,
			UUID: f.UUID, Slice: f.Slice, EnvPrefix: f.EnvPrefix, ShmSize: f.ShmSize, Choice: Choice{Tier: f.Tier, Region: f.Region}})
	}
	return d
}

// daemonsOnNode lists every claim daemon directory below Dir/mps.
func (m *Manager) daemonsOnNode() ([]daemonOnNode, error) {
	root := filepath.Join(m.opts.Dir, daemonsDir)
	claims, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("MPS daemons: %w", err)
	}
	var out []daemonOnNode
	for _, c := range claims {
		if !c.IsDir() {
			continue
		}
		ds, err := m.daemonsOfClaimDir(filepath.Join(root, c.Name()))
		if err != nil {
			return out, err
		}
		out = append(out, ds...)
	}
	return out, nil
}

// daemonsOfClaimDir lists the daemon directories of one claim directory.
func (m *Manager) daemonsOfClaimDir(claimDir string) ([]daemonOnNode, error) {
	entries, err := os.ReadDir(claimDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("MPS daemons: %w", err)
	}
	var out []daemonOnNode
	for _, e := range entries {
		if e.IsDir() && e.Name() != shmName {
			out = append(out, m.readDaemon(filepath.Join(claimDir, e.Name())))
		}
	}
	return out, nil
}

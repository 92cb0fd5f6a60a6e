// Package nodeformat versions what carve keeps on a node as one whole: the
// state directory (checkpoint, attach specs, the reaper's queue, claim
// files) and the pins under the BPF pin directory (the classifier's maps
// and links, pod guards) change together, release by release.
//
// The agent records the format it wrote in <state dir>/format.json, with
// the oldest format an agent must know to serve it (MinReader). At start it
// brings an older node's state up to its own format, one migration at a
// time, serves a newer one whose MinReader it meets (a rollback to a
// release that can), and refuses one it cannot serve, changing nothing:
// the newer agent's shares stay enforced by their pins while the operator
// rolls forward again. deploy/README.md's table says which release wrote
// which format.
package nodeformat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Current is the format this build writes.
//
//	1: carve 0.1.0, which recorded no format (a state directory with a
//	   checkpoint and no format.json).
//	2: pod guards pinned under <pin dir>/pod_guard, their state in the
//	   attach specs and undo records (fields 0.1.0 ignores); the
//	   share_flow_stats map retired. 0.1.0 serves it (TestNodeUpgrade).
//	3: the classifier's address maps keep a share's addresses by parent,
//	   VLAN and address (the key's padding, zero before, holds the VLAN):
//	   one address may be two shares' in two VLANs. Untagged shares'
//	   entries are unchanged, so older agents serve them as before; a
//	   VLAN share's addresses are in its VLAN, where an older classifier
//	   does not look: its pod's frames from them would be dropped.
const Current = 3

// MinReader is the oldest format an agent must know to serve what this
// build writes.
const MinReader = 1

// File is format.json.
type File struct {
	Version   int    `json:"version"`
	MinReader int    `json:"minReader"`
	WrittenBy string `json:"writtenBy,omitempty"`
}

// Path is format.json in stateDir.
func Path(stateDir string) string { return filepath.Join(stateDir, "format.json") }

// ErrTooNew is a node state this agent cannot serve.
var ErrTooNew = errors.New("the node's state was written by a newer carve that this one cannot serve")

// Migration brings a node's state from its version to the next.
type Migration func(stateDir, pinDir string) error

// migrations[v] takes format v to v+1.
var migrations = map[int]Migration{
	// 1 to 2: nothing on disk or in the pins changes form. A 0.1.0
	// share keeps running without a pod guard (its pods started before
	// there were any) and `carve shares` shows none; the retired
	// share_flow_stats map is unpinned by the classifier as it opens
	// (bpf.OpenShaper).
	1: func(string, string) error { return nil },
	// 2 to 3: a VLAN share's address entries are copied into its VLAN
	// (the untagged ones stay while it lives, for the programs the older
	// agent loaded). Only the shares' configs say which VLAN, so the NIC
	// preparer copies them as it restores its shares (netdev's
	// migrateVLANAddrs), before the agent serves; entries of untagged
	// shares stay as they are.
	2: func(string, string) error { return nil },
}

// Read reads stateDir's format: none (nil) for a fresh node, version 1 for
// a 0.1.0 node (a checkpoint, no format.json).
func Read(stateDir string) (*File, error) {
	raw, err := os.ReadFile(Path(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(stateDir, "checkpoint.json")); err == nil {
			return &File{Version: 1, MinReader: 1}, nil
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(raw, &f); err != nil || f.Version < 1 || f.MinReader < 1 || f.MinReader > f.Version {
		return nil, fmt.Errorf("%s: not a node state format (%s)", Path(stateDir), raw)
	}
	return &f, nil
}

// Prepare makes the node's state this build's to serve: it migrates an
// older one and records the format, keeps a newer one it can serve as it
// is, and refuses one it cannot (ErrTooNew, nothing changed). It returns
// the format found (nil: a fresh node).
func Prepare(stateDir, pinDir, writtenBy string) (*File, error) {
	found, err := Read(stateDir)
	if err != nil {
		return nil, err
	}
	if found != nil && found.Version > Current {
		if found.MinReader > Current {
			return found, fmt.Errorf("%w: %s records format %d (carve %s), which needs an agent of format %d or later; this one is format %d. "+
				"Nothing was changed and its shares stay enforced: run the newer carve again (helm rollback or upgrade)",
				ErrTooNew, Path(stateDir), found.Version, orUnknown(found.WrittenBy), found.MinReader, Current)
		}
		// Served as it is; the newer agent finds its own format again.
		return found, nil
	}
	if found != nil {
		for v := found.Version; v < Current; v++ {
			m, ok := migrations[v]
			if !ok {
				return found, fmt.Errorf("no migration of the node's state from format %d", v)
			}
			if err := m(stateDir, pinDir); err != nil {
				return found, fmt.Errorf("migrate the node's state from format %d to %d: %w", v, v+1, err)
			}
		}
	}
	raw, err := json.Marshal(File{Version: Current, MinReader: MinReader, WrittenBy: writtenBy})
	if err != nil {
		return found, err
	}
	if err := atomicfile.Write(Path(stateDir), append(raw, '\n'), 0o644); err != nil {
		return found, fmt.Errorf("record the node's state format: %w", err)
	}
	return found, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

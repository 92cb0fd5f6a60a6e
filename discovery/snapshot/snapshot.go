package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	ghwsnapshot "github.com/jaypipes/ghw/pkg/snapshot"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// Paths inside a snapshot, beside the host tree (sys/, proc/, boot/, usr/).
const (
	NVMLFile       = "carve/nvml.json"
	NodeConfigFile = "carve/nodeconfig.yaml"
)

// Options is what to capture.
type Options struct {
	// Root is the host root discovery reads.
	Root string
	// NVML is the node's NVML inventory; nil where it has none.
	NVML *nvmlinfo.Inventory
	// NodeConfig is the node config file's content; nil where none.
	NodeConfig []byte
}

// Capture writes the snapshot as a tar.gz to w.
func Capture(ctx context.Context, w io.Writer, opts Options) error {
	work, err := os.MkdirTemp("", "carve-snapshot-")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }() // a temporary directory: at worst left behind
	root := opts.Root
	if root == "" {
		root = "/"
	}
	if err := collect(root, work); err != nil {
		return fmt.Errorf("snapshot of %s: %w", root, err)
	}
	if opts.NVML != nil {
		var buf bytes.Buffer
		if err := nvmlinfo.Encode(&buf, opts.NVML); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(work, NVMLFile), buf.Bytes()); err != nil {
			return err
		}
	}
	if opts.NodeConfig != nil {
		if err := writeFile(filepath.Join(work, NodeConfigFile), opts.NodeConfig); err != nil {
			return err
		}
	}
	if err := ghwsnapshot.PackWithWriter(ctx, w, work); err != nil {
		return fmt.Errorf("snapshot: pack: %w", err)
	}
	return nil
}

// Unpacked is a snapshot expanded on this machine.
type Unpacked struct {
	// Root is the node's host tree, for discovery's Root.
	Root string
	// NVMLReplay is the NVML inventory file, "" where the node had none.
	NVMLReplay string
	// NodeConfig is the node config file, "" where the node had none.
	NodeConfig string
}

// Unpack expands a snapshot into dir (entries that would escape it are
// refused).
func Unpack(file, dir string) (Unpacked, error) {
	if err := ghwsnapshot.UnpackInto(file, dir); err != nil {
		return Unpacked{}, fmt.Errorf("unpack snapshot %s: %w", file, err)
	}
	u := Unpacked{Root: dir}
	if _, err := os.Stat(filepath.Join(dir, NVMLFile)); err == nil {
		u.NVMLReplay = filepath.Join(dir, NVMLFile)
	}
	if _, err := os.Stat(filepath.Join(dir, NodeConfigFile)); err == nil {
		u.NodeConfig = filepath.Join(dir, NodeConfigFile)
	}
	return u, nil
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

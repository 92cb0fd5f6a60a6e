// Package atomicfile writes files so that a crash at any moment leaves either
// the old content or the new, never a torn file.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write writes a file so that a crash, of the process or of the machine,
// leaves either the old or the new content, never a torn one: the data and
// the directory entry are synced.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, func(f *os.File) error { _, err := f.Write(data); return err }, perm, true)
}

// WriteFrom is Write with the content read from src, a buffer at a time:
// for files too large to hold in memory at once, as a binary the agent
// installs on the host.
func WriteFrom(path string, src io.Reader, perm os.FileMode) error {
	return write(path, func(f *os.File) error { _, err := io.Copy(f, src); return err }, perm, true)
}

// Replace writes a file so that a crash of the process leaves either the
// old or the new content, never a torn one, without waiting for the disk.
// It is for files that describe this boot only: the attach specs of network
// shares (their interfaces and classes die with the boot, and carve removes
// the specs of an earlier boot at start) and the claim files containers
// read. A power cut may leave such a file empty or old, and the next boot
// discards it anyway; two fsyncs per file would buy nothing, and they are on
// the kubelet's path.
func Replace(path string, data []byte, perm os.FileMode) error {
	return write(path, func(f *os.File) error { _, err := f.Write(data); return err }, perm, false)
}

// write has fill write the content into a temporary file beside path, then
// renames it over path.
func write(path string, fill func(*os.File) error, perm os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// Gone already once renamed; left to remove on the paths that fail.
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := fill(tmp); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			_ = tmp.Close()
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	err = d.Sync()
	_ = d.Close() // opened to sync, nothing written through it
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

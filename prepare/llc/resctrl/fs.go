package resctrl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// FS is the resctrl filesystem. Paths are relative to its mount point:
// "schemata" is the default group's, "<group>/schemata" a group's.
type FS interface {
	ReadFile(rel string) ([]byte, error)
	// WriteFile writes to an existing file, as resctrl's files are only
	// ever written, never created.
	WriteFile(rel string, data []byte) error
	// Mkdir creates a group; it fails with fs.ErrExist where the group
	// exists and syscall.ENOSPC where no CLOSID is left.
	Mkdir(rel string) error
	// Remove removes a group; its tasks go back to the default group.
	Remove(rel string) error
}

// Dir is the resctrl filesystem mounted at a directory.
type Dir string

// HostDir is where resctrl is mounted on a host, under a root.
func HostDir(root string) Dir { return Dir(filepath.Join(root, "sys/fs/resctrl")) }

func (d Dir) path(rel string) string { return filepath.Join(string(d), rel) }

// ReadFile reads a file of the filesystem.
func (d Dir) ReadFile(rel string) ([]byte, error) { return os.ReadFile(d.path(rel)) }

// WriteFile writes data in one write, as the kernel parses each write
// whole. O_CREATE changes nothing on resctrl, whose files exist from the
// group's mkdir, and lets a fixture of plain files (an agent run against a
// fixture root) be written the same way.
func (d Dir) WriteFile(rel string, data []byte) error {
	f, err := os.OpenFile(d.path(rel), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", strings.TrimSpace(string(data)), d.path(rel), werr)
	}
	return nil
}

// Mkdir creates a group.
func (d Dir) Mkdir(rel string) error {
	return os.Mkdir(d.path(rel), 0o755)
}

// Remove removes a group; a missing one is not an error. resctrl removes
// a group with its files; a directory of plain files (a fixture) refuses
// with ENOTEMPTY and is removed with them.
func (d Dir) Remove(rel string) error {
	err := syscall.Rmdir(d.path(rel))
	if errors.Is(err, syscall.ENOTEMPTY) {
		err = os.RemoveAll(d.path(rel))
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove resctrl group %s: %w", d.path(rel), err)
	}
	return nil
}

// WithStatus adds the kernel's explanation of the last failed command
// (info/last_cmd_status) to the error of a refused write or mkdir.
func WithStatus(f FS, err error) error {
	if err == nil {
		return nil
	}
	b, rerr := f.ReadFile("info/last_cmd_status")
	if s := strings.TrimSpace(string(b)); rerr == nil && s != "" && s != "ok" {
		return fmt.Errorf("%w (resctrl: %s)", err, s)
	}
	return err
}

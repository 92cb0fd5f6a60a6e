package discovery

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tree reads files below a root directory. Every path it takes is relative to
// the root, and every error it returns names the file, so that a malformed
// sysfs entry can be found.
type tree struct {
	root string
}

func (t tree) path(rel string) string { return filepath.Join(t.root, rel) }

// optionalString reads a file that may be missing. A missing file (or one the
// kernel refuses to read, as `speed` on a down link) is ("", false, nil).
func (t tree) optionalString(rel string) (string, bool, error) {
	b, err := os.ReadFile(t.path(rel))
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), true, nil
	case errors.Is(err, fs.ErrNotExist), isUnreadableAttribute(err):
		return "", false, nil
	default:
		return "", false, fmt.Errorf("read %s: %w", t.path(rel), err)
	}
}

// optionalInt reads a decimal integer from a file that may be missing.
func (t tree) optionalInt(rel string) (int64, bool, error) {
	s, ok, err := t.optionalString(rel)
	if err != nil || !ok {
		return 0, ok, err
	}
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s: %q is not an integer", t.path(rel), truncate(s, 40))
	}
	return v, true, nil
}

// linkBase is the last element of a symlink's target ("" when missing).
func (t tree) linkBase(rel string) string {
	target, err := os.Readlink(t.path(rel))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// resolve follows the symlinks of rel and returns the real path.
func (t tree) resolve(rel string) (string, error) {
	p, err := filepath.EvalSymlinks(t.path(rel))
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", t.path(rel), err)
	}
	return p, nil
}

// isUnreadableAttribute reports errors sysfs gives for attributes that exist
// but have no value now: EINVAL for the speed of a link that is down.
func isUnreadableAttribute(err error) bool {
	return errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENODEV)
}

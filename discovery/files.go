package discovery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// tree reads files below a root directory. Every path it takes is relative to
// the root, and every error it returns names the file, so that a malformed
// sysfs entry can be found.
type tree struct {
	root string
}

func (t tree) path(rel string) string { return filepath.Join(t.root, rel) }

// at is the tree's root as a dir read relative to the working directory.
func (t tree) at() dir { return dir{fd: unix.AT_FDCWD, path: ""} }

// optionalString reads a file that may be missing. A missing file (or one the
// kernel refuses to read, as `speed` on a down link) is ("", false, nil).
func (t tree) optionalString(rel string) (string, bool, error) {
	return t.at().optionalString(t.path(rel))
}

// optionalInt reads a decimal integer from a file that may be missing.
func (t tree) optionalInt(rel string) (int64, bool, error) {
	return t.at().optionalInt(t.path(rel))
}

// resolve follows the symlinks of rel and returns the real path.
func (t tree) resolve(rel string) (string, error) {
	p, err := filepath.EvalSymlinks(t.path(rel))
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", t.path(rel), err)
	}
	return p, nil
}

// openDir opens a directory of the tree for reads relative to it: its path
// is resolved once, not again for every file read below it. ok is false
// where it is missing.
func (t tree) openDir(rel string) (d dir, ok bool, err error) {
	return t.at().openDir(t.path(rel))
}

// dir is an open directory whose files are read relative to it (openat):
// discovery reads about ten files of each of thousands of netdevs and PCI
// functions, and resolving each file's whole path through sysfs's symlinks
// was most of its time. Errors name the file by its path.
type dir struct {
	fd   int
	path string
}

func (d dir) name(rel string) string {
	if d.path == "" {
		return rel
	}
	return d.path + "/" + rel
}

// openDir opens rel below d (following symlinks); ok is false where it is
// missing. The caller closes it.
func (d dir) openDir(rel string) (dir, bool, error) {
	fd, err := openat(d.fd, rel, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case err == nil:
		return dir{fd: fd, path: d.name(rel)}, true, nil
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		return dir{}, false, nil
	default:
		return dir{}, false, fmt.Errorf("open %s: %w", d.name(rel), err)
	}
}

func (d dir) close() {
	if d.fd >= 0 && d.fd != unix.AT_FDCWD {
		unix.Close(d.fd)
	}
}

func (d dir) optionalString(rel string) (string, bool, error) {
	s, err := readSmallAt(d.fd, rel)
	switch {
	case err == nil:
		return s, true, nil
	case errors.Is(err, fs.ErrNotExist), isUnreadableAttribute(err):
		return "", false, nil
	default:
		return "", false, fmt.Errorf("read %s: %w", d.name(rel), err)
	}
}

func (d dir) optionalInt(rel string) (int64, bool, error) {
	s, ok, err := d.optionalString(rel)
	if err != nil || !ok {
		return 0, ok, err
	}
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s: %q is not an integer", d.name(rel), truncate(s, 40))
	}
	return v, true, nil
}

func (d dir) linkBase(rel string) string {
	target, ok, _ := d.optionalLink(rel)
	if !ok {
		return ""
	}
	return filepath.Base(target)
}

func (d dir) optionalLink(rel string) (string, bool, error) {
	bp := smallBufs.Get().(*[]byte)
	defer smallBufs.Put(bp)
	for {
		n, err := unix.Readlinkat(d.fd, rel, *bp)
		if err == unix.EINTR {
			continue
		}
		switch {
		case err == nil && n < len(*bp):
			return string((*bp)[:n]), true, nil
		case err == nil:
			*bp = make([]byte, 2*len(*bp))
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
			return "", false, nil
		case errors.Is(err, syscall.EINVAL):
			return "", false, fmt.Errorf("read link %s: not a symbolic link", d.name(rel))
		default:
			return "", false, fmt.Errorf("read link %s: %w", d.name(rel), err)
		}
	}
}

func openat(dirfd int, rel string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, rel, flags|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// smallBufs are read buffers: sysfs attributes fit in a page.
var smallBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

// readSmallAt reads a small file with three system calls (open, read,
// close) where os.ReadFile makes five, and returns it trimmed. A read that
// returns less than was asked ends the file: sysfs hands out an attribute
// whole in its first read, and a regular file is short only at its end.
func readSmallAt(dirfd int, rel string) (string, error) {
	fd, err := openat(dirfd, rel, unix.O_RDONLY)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	defer unix.Close(fd)
	bp := smallBufs.Get().(*[]byte)
	defer smallBufs.Put(bp)
	buf, n := *bp, 0
	for {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "read", Path: rel, Err: err}
		}
		n += m
		if m == 0 || n < len(buf) {
			break
		}
		buf = append(buf, make([]byte, len(buf))...)
	}
	if len(buf) <= 1<<16 {
		*bp = buf
	}
	return string(bytes.TrimSpace(buf[:n])), nil
}

// isUnreadableAttribute reports errors sysfs gives for attributes that exist
// but have no value now: EINVAL for the speed of a link that is down.
func isUnreadableAttribute(err error) bool {
	return errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENODEV)
}

// dirEntry is a directory entry with its inode number. sysfs gives the
// entries of a device it makes again (a function hot-plugged back, a netdev
// re-created under the same name) a new inode (kernfs hands inode numbers
// out in turn, not the freed one again), so names and inodes together say
// whether what a directory lists is what an earlier read found. A fixture
// on a disk file system may get a freed inode back at once: its tests make
// sure they do not (see the Scanner tests).
type dirEntry struct {
	name string
	ino  uint64
}

// readDirInodes lists a directory with getdents, which gives each entry's
// inode without a stat. The entries come sorted by name; a missing directory
// is an empty list.
func readDirInodes(path string) ([]dirEntry, error) {
	fd, err := openat(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, syscall.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	defer unix.Close(fd)
	var out []dirEntry
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", path, err)
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64: ino (8), off (8), reclen (2), type
		// (1), then the name, NUL-terminated and padded.
		for off := 0; off+19 <= n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen < 19 || off+reclen > n {
				return nil, fmt.Errorf("list %s: malformed directory entry", path)
			}
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				out = append(out, dirEntry{name: s, ino: binary.NativeEndian.Uint64(buf[off:])})
			}
			off += reclen
		}
	}
	slices.SortFunc(out, func(a, b dirEntry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// addDir is --dir SRC:DEST: the tree SRC at DEST with its modes and
// symlinks, as cp -a SRC/. DEST/ made it (DEST itself takes SRC's mode).
// No ldd scan: a tree is data or already self-contained.
func (r rootfs) addDir(spec string) error {
	src, dest, found := strings.Cut(spec, ":")
	if !found {
		dest = src
	}
	if !path.IsAbs(dest) {
		return fmt.Errorf("--dir %s: destination must be absolute", spec)
	}
	if st, err := os.Stat(src); err != nil || !st.IsDir() {
		return fmt.Errorf("--dir %s: %s is not a directory", spec, src)
	}
	// SRC/. goes through SRC when SRC is a symlink; WalkDir would not.
	resolved, err := filepath.EvalSymlinks(src)
	if err != nil {
		return fmt.Errorf("--dir %s: %w", spec, err)
	}
	err = filepath.WalkDir(resolved, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(resolved, p)
		if err != nil {
			return err
		}
		return r.copyEntry(p, path.Join(dest, filepath.ToSlash(rel)), d)
	})
	if err != nil {
		return fmt.Errorf("--dir %s: %w", spec, err)
	}
	return nil
}

// copyEntry copies one entry of a --dir tree; WalkDir visits a directory
// before what is in it, so the parent of to exists.
func (r rootfs) copyEntry(from, to string, d fs.DirEntry) error {
	info, err := d.Info()
	if err != nil {
		return err
	}
	mode := info.Mode()
	if e, ok := r[to]; ok && e.mode.IsDir() && !mode.IsDir() {
		return fmt.Errorf("cannot put %s over the directory %s", from, to)
	}
	switch {
	case mode.IsDir():
		if err := r.mkdirAll(to); err != nil {
			return err
		}
		r[to].mode = fs.ModeDir | mode&modeBits
	case mode.IsRegular():
		r[to] = &entry{mode: mode & modeBits, src: from}
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(from)
		if err != nil {
			return err
		}
		r[to] = &entry{mode: fs.ModeSymlink | 0o777, target: target}
	default:
		// Devices, sockets and pipes have no place in these images.
		return fmt.Errorf("%s: unsupported file type %s", from, mode.Type())
	}
	return nil
}

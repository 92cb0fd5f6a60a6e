package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// entry is one path of the image's file system. A regular file keeps only
// the host path it comes from: it is read when the layer is written, so an
// image of large binaries is never held in memory.
type entry struct {
	mode   fs.FileMode // type and permission bits, setuid/setgid/sticky included
	src    string      // regular file: the host file (symlinks followed, as cp -L)
	target string      // symlink: what it points to
}

// rootfs is the image's file system, keyed by clean absolute path ("/" is
// the root itself).
type rootfs map[string]*entry

// modeBits are the bits a file keeps in the image: cp --preserve=mode kept
// exactly these.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// newRootfs has the mount points runc expects; it would create them, but an
// image that has them behaves the same on every runtime. /tmp is
// world-writable as usual.
func newRootfs() rootfs {
	r := rootfs{"/": {mode: fs.ModeDir | 0o755}}
	for _, d := range []string{"/proc", "/sys", "/dev", "/etc"} {
		r[d] = &entry{mode: fs.ModeDir | 0o755}
	}
	r["/tmp"] = &entry{mode: fs.ModeDir | fs.ModeSticky | 0o777}
	return r
}

// mkdirAll is mkdir -p inside the image: missing directories get 0755.
func (r rootfs) mkdirAll(p string) error {
	if e, ok := r[p]; ok {
		if !e.mode.IsDir() {
			return fmt.Errorf("%s is not a directory in the image", p)
		}
		return nil
	}
	if err := r.mkdirAll(path.Dir(p)); err != nil {
		return err
	}
	r[p] = &entry{mode: fs.ModeDir | 0o755}
	return nil
}

// putFile copies the host file src (following symlinks: the image gets the
// content, e.g. libc.so.6 rather than a dangling link to libc-2.36.so) to
// dest, or into dest when dest is a directory, as cp does.
func (r rootfs) putFile(src, dest string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("%s: not a file: %w", src, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a file", src)
	}
	if e, ok := r[dest]; ok && e.mode.IsDir() {
		dest = path.Join(dest, filepath.Base(src))
	}
	if err := r.mkdirAll(path.Dir(dest)); err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dest, err)
	}
	r[dest] = &entry{mode: st.Mode() & modeBits, src: src}
	return nil
}

// addFile is --file SRC[:DEST]: the file, and the shared libraries and
// loader ldd lists for it at the paths ldd prints, unless the image has
// something there already.
func (r rootfs) addFile(spec string) error {
	src, dest, found := strings.Cut(spec, ":")
	if !found {
		dest = src
	}
	if !path.IsAbs(dest) {
		return fmt.Errorf("--file %s: destination must be absolute", spec)
	}
	if err := r.putFile(src, path.Clean(dest)); err != nil {
		return err
	}
	libs, err := sharedLibs(src)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if _, ok := r[lib]; ok {
			continue
		}
		if err := r.putFile(lib, lib); err != nil {
			return fmt.Errorf("a library of %s: %w", src, err)
		}
	}
	return nil
}

// addSymlink is --symlink LINK=TARGET: LINK replaces whatever file or link
// the image had there (ln -sfn).
func (r rootfs) addSymlink(spec string) error {
	link, target, found := strings.Cut(spec, "=")
	if !found || target == "" {
		return fmt.Errorf("--symlink %s: want LINK=TARGET", spec)
	}
	if !path.IsAbs(link) {
		return fmt.Errorf("--symlink %s: the link must be absolute", spec)
	}
	link = path.Clean(link)
	if err := r.mkdirAll(path.Dir(link)); err != nil {
		return fmt.Errorf("--symlink %s: %w", spec, err)
	}
	if e, ok := r[link]; ok && e.mode.IsDir() {
		return fmt.Errorf("--symlink %s: %s is a directory in the image", spec, link)
	}
	r[link] = &entry{mode: fs.ModeSymlink | 0o777, target: target}
	return nil
}

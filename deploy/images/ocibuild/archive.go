package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// tarDir writes the layout dir as the archive out (oci-layout, index.json,
// blobs/sha256/... under ./, which is what `ctr images import` reads) and
// returns its size. It is written beside out and renamed, so out is never
// half an archive. WalkDir's lexical order and fixed modes, owners and
// times make the same layout the same bytes.
func tarDir(dir, out string) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return 0, fmt.Errorf("creating the directory of %s: %w", out, err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return 0, fmt.Errorf("creating %s: %w", tmp, err)
	}
	defer func() { _ = os.Remove(tmp) }() // a no-op once renamed
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		name := "./" + filepath.ToSlash(rel)
		switch {
		case rel == ".":
			name = "./"
		case d.IsDir():
			name += "/"
		}
		return addToArchive(tw, p, name, d.IsDir())
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", tmp, err)
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return 0, fmt.Errorf("moving the archive into place: %w", err)
	}
	return st.Size(), nil
}

// addToArchive writes the file or directory p under name.
func addToArchive(tw *tar.Writer, p, name string, isDir bool) error {
	if isDir {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch})
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: st.Size(), ModTime: epoch}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is every file's and the image's time: the digest depends only on the
// content.
var epoch = time.Unix(0, 0).UTC()

// writeLayer writes the rootfs as an uncompressed tar to file and returns it
// as the image's layer. Uncompressed, as build.sh always made it: the
// archive is imported on this same host, so gzip would only cost time.
func writeLayer(r rootfs, file string) (v1.Layer, error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("creating the layer: %w", err)
	}
	err = r.writeTar(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing the layer: %w", err)
	}
	l := &fileLayer{path: file}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }() // read only
	if l.digest, l.size, err = v1.SHA256(rc); err != nil {
		return nil, fmt.Errorf("hashing the layer: %w", err)
	}
	return partial.CompressedToLayer(l)
}

// writeTar writes every entry, each directory's entries sorted by name
// (GNU tar --sort=name), owned by root, at the epoch. Replacing "/" by NUL
// makes a plain string sort a depth-first walk: NUL sorts before every byte
// a name can hold.
func (r rootfs) writeTar(w io.Writer) error {
	paths := make([]string, 0, len(r))
	for p := range r {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int {
		return strings.Compare(strings.ReplaceAll(a, "/", "\x00"), strings.ReplaceAll(b, "/", "\x00"))
	})
	tw := tar.NewWriter(w)
	for _, p := range paths {
		if err := r[p].writeTo(tw, p); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeTo writes one entry at p; names are ./-relative, as tar -C ROOT . made
// them.
func (e *entry) writeTo(tw *tar.Writer, p string) error {
	hdr := &tar.Header{Name: "." + p, Mode: tarMode(e.mode), ModTime: epoch}
	switch {
	case e.mode.IsDir():
		hdr.Typeflag = tar.TypeDir
		hdr.Name = strings.TrimSuffix(hdr.Name, "/") + "/"
		return tw.WriteHeader(hdr)
	case e.mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.target
		return tw.WriteHeader(hdr)
	}
	f, err := os.Open(e.src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", e.src, err)
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading %s: %w", e.src, err)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	// CopyN: a file that grows meanwhile still matches its header.
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("copying %s: %w", e.src, err)
	}
	return nil
}

// tarMode is the Unix mode a tar header stores: fs.FileMode keeps setuid,
// setgid and sticky outside the low 12 bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// fileLayer is the layer tar in a file. go-containerregistry's tarball
// layers are always gzipped, so this is the partial.CompressedLayer it makes
// an uncompressed v1.Layer from: the "compressed" bytes are the tar itself.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error) { return l.digest, nil }

// DiffID is the digest: the stored bytes are the uncompressed tar.
func (l *fileLayer) DiffID() (v1.Hash, error)           { return l.Digest() }
func (l *fileLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)               { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) {
	return types.OCIUncompressedLayer, nil
}

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// defaultPath is the image's PATH unless --env sets one: the usual Debian one.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// run builds the archive o asks for, prints its path as the last line of
// stdout and a summary on stderr.
func run(o options, stdout, stderr io.Writer) error {
	ref, tag, err := containerdRef(o.name)
	if err != nil {
		return err
	}
	root, err := assemble(o)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "carve-image.")
	if err != nil {
		return fmt.Errorf("creating a work dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	layer, err := writeLayer(root, filepath.Join(work, "layer.tar"))
	if err != nil {
		return err
	}
	img, err := buildImage(layer, o)
	if err != nil {
		return err
	}
	dir := filepath.Join(work, "layout")
	if err := writeLayout(img, dir, ref, tag); err != nil {
		return err
	}
	size, err := tarDir(dir, o.out)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("the manifest digest: %w", err)
	}
	fmt.Fprintf(stderr, "[image-build] built %s (%s, manifest %s) -> %s\n", ref, humanSize(size), digest, o.out)
	_, err = fmt.Fprintln(stdout, o.out)
	return err
}

// assemble is the image's file system: files first (with their libraries),
// then trees, then symlinks, as build.sh did.
func assemble(o options) (rootfs, error) {
	root := newRootfs()
	for _, spec := range o.files {
		if err := root.addFile(spec); err != nil {
			return nil, err
		}
	}
	for _, spec := range o.dirs {
		if err := root.addDir(spec); err != nil {
			return nil, err
		}
	}
	for _, spec := range o.links {
		if err := root.addSymlink(spec); err != nil {
			return nil, err
		}
	}
	return root, nil
}

// buildImage is an OCI image of the one layer with o's configuration.
// Created and the history time are the epoch, like the files: a rebuild of
// the same inputs is the same image.
func buildImage(layer v1.Layer, o options) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "deploy/images/build.sh"},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cf = cf.DeepCopy()
	// The tool runs on the host the image is for; GOARCH is its
	// architecture in OCI's spelling.
	cf.Architecture, cf.OS, cf.Created = runtime.GOARCH, "linux", v1.Time{Time: epoch}
	cf.Config.Env = withPath(o.env)
	cf.Config.WorkingDir = o.workdir
	cf.Config.Entrypoint, cf.Config.Cmd = o.entrypoint, o.cmd
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// withPath puts defaultPath first unless env sets PATH.
func withPath(env []string) []string {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return env
		}
	}
	return append([]string{defaultPath}, env...)
}

// writeLayout writes img as an OCI image layout in dir. The index entry's
// io.containerd.image.name makes `ctr images import` store exactly ref;
// org.opencontainers.image.ref.name is the standard (tag-only) name.
func writeLayout(img v1.Image, dir, ref, tag string) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the image layout: %w", err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	}))
	if err != nil {
		return fmt.Errorf("writing the image into its layout: %w", err)
	}
	return nil
}

// humanSize is n in du -h's style, for the log line.
func humanSize(n int64) string {
	f, unit := float64(n), ""
	for _, u := range []string{"K", "M", "G", "T"} {
		if f < 1024 {
			break
		}
		f, unit = f/1024, u
	}
	if unit == "" {
		return fmt.Sprintf("%d", n)
	}
	return fmt.Sprintf("%.1f%s", f, unit)
}

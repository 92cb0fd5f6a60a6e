package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"
)

// options is the parsed command line; the flags are documented in
// deploy/images/build.sh, which is the command users run.
type options struct {
	name       string
	out        string
	workdir    string
	files      []string // SRC[:DEST]
	dirs       []string // SRC:DEST
	links      []string // LINK=TARGET
	entrypoint []string
	cmd        []string
	env        []string // KEY=VALUE
}

// parseArgs reads build.sh's command line. StringArray, not StringSlice:
// values are taken whole, commas included, in the order given.
func parseArgs(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("build.sh", pflag.ContinueOnError)
	// Errors are returned and printed once, by main, not by pflag too.
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.name, "name", "", "image name NAME[:TAG] (required)")
	fs.StringArrayVar(&o.files, "file", nil, "SRC[:DEST]: a file, plus the shared libraries ldd lists for it")
	fs.StringArrayVar(&o.dirs, "dir", nil, "SRC:DEST: a directory tree (no ldd scan)")
	fs.StringArrayVar(&o.links, "symlink", nil, "LINK=TARGET: a symlink")
	fs.StringArrayVar(&o.entrypoint, "entrypoint", nil, "append to the Entrypoint")
	fs.StringArrayVar(&o.cmd, "cmd", nil, "append to the Cmd")
	fs.StringArrayVar(&o.env, "env", nil, "KEY=VALUE: add to the Env")
	fs.StringVar(&o.workdir, "workdir", "/", "the WorkingDir")
	fs.StringVar(&o.out, "out", "", "the archive (default ${CARVE_IMAGE_DIR:-/tmp/carve-images}/<name>_<tag>.tar)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return o, fmt.Errorf("usage: build.sh --name NAME[:TAG] [options]\n%s", fs.FlagUsages())
		}
		return o, fmt.Errorf("%w (see the usage at the top of deploy/images/build.sh)", err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (every option takes a value)", fs.Arg(0))
	}
	if o.name == "" {
		return o, errors.New("--name is required")
	}
	if len(o.files) == 0 && len(o.dirs) == 0 {
		return o, errors.New("nothing to put in the image (--file/--dir)")
	}
	if o.out == "" {
		o.out = defaultOut(o.name, os.Getenv("CARVE_IMAGE_DIR"))
	}
	abs, err := filepath.Abs(o.out)
	if err != nil {
		return o, fmt.Errorf("--out %s: %w", o.out, err)
	}
	o.out = abs
	return o, nil
}

// defaultOut is DIR/<name>_<tag>.tar, with / and : of the name as _ and
// _latest added when the name has no ':' at all, as build.sh always did.
func defaultOut(name, dir string) string {
	if dir == "" {
		dir = "/tmp/carve-images"
	}
	base := strings.NewReplacer("/", "_", ":", "_").Replace(name)
	if !strings.Contains(name, ":") {
		base += "_latest"
	}
	return filepath.Join(dir, base+".tar")
}

// containerdRef is the fully qualified reference containerd stores and the
// kubelet asks for when a pod says `image: NAME` (carve:dev ->
// docker.io/library/carve:dev), and the tag alone. go-containerregistry
// parses and validates as docker does, but spells Docker Hub
// index.docker.io, which containerd calls docker.io.
func containerdRef(s string) (ref, tag string, err error) {
	t, err := name.NewTag(s)
	if err != nil {
		return "", "", fmt.Errorf("--name %s: %w", s, err)
	}
	registry := t.RegistryStr()
	if registry == name.DefaultRegistry {
		registry = "docker.io"
	}
	return registry + "/" + t.RepositoryStr() + ":" + t.TagStr(), t.TagStr(), nil
}

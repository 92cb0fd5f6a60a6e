package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestBuild builds a real image from temp files (no ELF, so no ldd), reads
// the archive back through go-containerregistry's layout reader and checks
// what an importer sees; then builds it again and wants the same digest.
func TestBuild(t *testing.T) {
	src := t.TempDir()
	write(t, filepath.Join(src, "tool"), "#!/bin/sh\necho hi\n", 0o755)
	write(t, filepath.Join(src, "tree/conf/a.yaml"), "a: 1\n", 0o640)
	if err := os.Symlink("a.yaml", filepath.Join(src, "tree/conf/current")); err != nil {
		t.Fatal(err)
	}
	// --dir keeps the tree's modes; whatever the umask, they are these.
	for _, d := range []string{"tree", "tree/conf"} {
		if err := os.Chmod(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--name", "carve-test:dev",
		"--file", filepath.Join(src, "tool") + ":/usr/bin/tool",
		"--dir", filepath.Join(src, "tree") + ":/etc/carve",
		"--symlink", "/bin/sh=busybox",
		"--entrypoint", "/usr/bin/tool", "--entrypoint", "-v", "--cmd", "run",
		"--env", "FOO=a,b", "--workdir", "/work"}

	dir, digest := build(t, append(args, "--out", filepath.Join(t.TempDir(), "a.tar")))
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v, %+v", err, im)
	}
	desc := im.Manifests[0]
	if got := desc.Annotations["io.containerd.image.name"]; got != "docker.io/library/carve-test:dev" {
		t.Errorf("io.containerd.image.name = %q", got)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "dev" {
		t.Errorf("org.opencontainers.image.ref.name = %q", got)
	}
	if desc.Digest != digest {
		t.Errorf("index names %s, build logged %s", desc.Digest, digest)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, img)
	checkLayer(t, img, map[string]string{
		"./":                       "dir 755",
		"./bin/":                   "dir 755",
		"./bin/sh":                 "link busybox",
		"./dev/":                   "dir 755",
		"./etc/":                   "dir 755",
		"./etc/carve/":             "dir 755",
		"./etc/carve/conf/":        "dir 755",
		"./etc/carve/conf/a.yaml":  "file 640 a: 1\n",
		"./etc/carve/conf/current": "link a.yaml",
		"./proc/":                  "dir 755",
		"./sys/":                   "dir 755",
		"./tmp/":                   "dir 1777",
		"./usr/":                   "dir 755",
		"./usr/bin/":               "dir 755",
		"./usr/bin/tool":           "file 755 #!/bin/sh\necho hi\n",
	})

	_, again := build(t, append(args, "--out", filepath.Join(t.TempDir(), "b.tar")))
	if again != digest {
		t.Errorf("a rebuild gave %s, the first build %s", again, digest)
	}
}

// build runs the tool's code on args and returns the unpacked archive's
// directory and the image digest.
func build(t *testing.T, args []string) (string, v1.Hash) {
	t.Helper()
	o, err := parseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(o, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(stdout.String()); got != o.out {
		t.Fatalf("stdout %q, want the archive path %s", got, o.out)
	}
	_, after, ok := strings.Cut(stderr.String(), "manifest ")
	h, err := v1.NewHash(strings.SplitN(after, ")", 2)[0])
	if !ok || err != nil {
		t.Fatalf("no manifest digest in %q: %v", stderr.String(), err)
	}
	dir := t.TempDir()
	untar(t, o.out, dir)
	return dir, h
}

func checkConfig(t *testing.T, img v1.Image) {
	t.Helper()
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.Architecture != runtime.GOARCH || cf.OS != "linux" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	if !slices.Equal(c.Env, []string{defaultPath, "FOO=a,b"}) || c.WorkingDir != "/work" ||
		!slices.Equal(c.Entrypoint, []string{"/usr/bin/tool", "-v"}) || !slices.Equal(c.Cmd, []string{"run"}) {
		t.Errorf("config %+v", c)
	}
}

// checkLayer wants the one uncompressed layer to hold exactly want: name ->
// "dir MODE", "link TARGET" or "file MODE CONTENT", owned by root at the
// epoch.
func checkLayer(t *testing.T, img v1.Image, want map[string]string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v, %d", err, len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCIUncompressedLayer {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: owner %d:%d, time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			got[h.Name] = "dir " + oct(h.Mode)
		case tar.TypeSymlink:
			got[h.Name] = "link " + h.Linkname
		default:
			b, _ := io.ReadAll(tr)
			got[h.Name] = "file " + oct(h.Mode) + " " + string(b)
		}
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q, want %q", name, got[name], w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected %s", name)
		}
	}
}

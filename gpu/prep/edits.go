package prep

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/go-logr/logr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
)

func jsonMarshal(v any) (json.RawMessage, error) { return json.Marshal(v) }

// nvcdiLib builds nvidia-container-toolkit's CDI library over the session's
// NVML, the host's driver root and /dev.
func (p *Preparer) nvcdiLib(l gpu.Library) (nvcdi.Interface, error) {
	opts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(l.Interface),
		nvcdi.WithDeviceLib(device.New(l.Interface)),
		nvcdi.WithDriverRoot(filepath.Join(p.opts.Root, p.opts.DriverRoot)),
		nvcdi.WithDevRoot(p.opts.Root),
		nvcdi.WithLogger(nvcdiLogger{p.opts.Logger}),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	}
	if p.opts.CDIHookPath != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(p.opts.CDIHookPath))
	} else {
		opts = append(opts, nvcdi.WithDisabledHooks(nvcdi.AllHooks))
	}
	return nvcdi.New(opts...)
}

// commonEdits are what every GPU container needs: the control and UVM
// device nodes, the driver's libraries and binaries.
func (p *Preparer) commonEdits(ctx context.Context) (cdispec.ContainerEdits, error) {
	p.ensureUVMNodes()
	var edits cdispec.ContainerEdits
	err := p.opts.NVML.Do(ctx, "CDI edits", func(l gpu.Library) error {
		lib, err := p.nvcdiLib(l)
		if err != nil {
			return err
		}
		common, err := lib.GetCommonEdits()
		if err != nil {
			return fmt.Errorf("driver files: %w", err)
		}
		if common != nil && common.ContainerEdits != nil {
			edits = *common.ContainerEdits
		}
		return nil
	})
	if err != nil {
		return edits, err
	}
	p.completeLibraries(&edits)
	p.hostPaths(&edits)
	return edits, nil
}

// wholeGPUEdits are the common edits and the GPU's own device node.
func (p *Preparer) wholeGPUEdits(ctx context.Context, d nvmlinfo.Device) (cdispec.ContainerEdits, error) {
	edits, err := p.commonEdits(ctx)
	if err != nil {
		return edits, err
	}
	var devs []cdispec.Device
	err = p.opts.NVML.Do(ctx, "CDI device edits", func(l gpu.Library) error {
		lib, err := p.nvcdiLib(l)
		if err != nil {
			return err
		}
		devs, err = lib.GetDeviceSpecsByID(d.UUID)
		return err
	})
	if err != nil {
		return edits, fmt.Errorf("device edits: %w", err)
	}
	for _, dev := range devs {
		p.hostPaths(&dev.ContainerEdits)
		edits.DeviceNodes = append(edits.DeviceNodes, dev.ContainerEdits.DeviceNodes...)
		edits.Mounts = append(edits.Mounts, dev.ContainerEdits.Mounts...)
		edits.Env = append(edits.Env, dev.ContainerEdits.Env...)
	}
	want := fmt.Sprintf("/dev/nvidia%d", d.Minor)
	for _, n := range edits.DeviceNodes {
		if n.Path == want {
			return edits, nil
		}
	}
	return edits, fmt.Errorf("device node %s not found under %s", want, filepath.Join(p.opts.Root, "dev"))
}

var versionedLib = regexp.MustCompile(`^lib.*\.so\.[0-9]+\.[0-9.]+$`)

// completeLibraries does what nvidia-ctk's hooks would where the host has
// none: it mounts each versioned library under its soname links too
// (libcuda.so.1), beside it and in the directories the C library's loader
// searches by default (loaderDirs), so that CUDA finds the driver whatever
// the image. It sets no LD_LIBRARY_PATH: a CDI edit's variable replaces
// the image's, and a CUDA image's own (its CUDA toolkit, its compat
// libraries) is what its programs need beside the driver.
func (p *Preparer) completeLibraries(edits *cdispec.ContainerEdits) {
	if p.opts.CDIHookPath != "" {
		return
	}
	have := map[string]bool{}
	for _, m := range edits.Mounts {
		have[m.ContainerPath] = true
	}
	var extra []*cdispec.Mount
	for _, m := range edits.Mounts {
		if !versionedLib.MatchString(filepath.Base(m.HostPath)) {
			continue
		}
		dirs := append([]string{filepath.Dir(m.ContainerPath)}, loaderDirs(runtime.GOARCH)...)
		for _, link := range sonameLinks(m.HostPath) {
			for _, dir := range dirs {
				cpath := filepath.Join(dir, link)
				if have[cpath] {
					continue
				}
				have[cpath] = true
				extra = append(extra, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: cpath, Options: m.Options})
			}
		}
	}
	edits.Mounts = append(edits.Mounts, extra...)
}

// loaderDirs are the directories glibc's loader searches by default
// (after LD_LIBRARY_PATH and its cache) in images of the architecture:
// Debian's and Ubuntu's multiarch directory and the lib64 of Red Hat's and
// SUSE's (`ld.so --help`, "system search path": /lib/x86_64-linux-gnu,
// /usr/lib/x86_64-linux-gnu, /lib, /usr/lib on Debian 12; /lib64,
// /usr/lib64 on RHEL). musl images cannot load the driver's glibc
// libraries at all.
func loaderDirs(goarch string) []string {
	switch goarch {
	case "amd64":
		return []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64"}
	case "arm64":
		return []string{"/usr/lib/aarch64-linux-gnu", "/usr/lib64"}
	default:
		return nil
	}
}

// sonameLinks lists the symlinks beside a library that resolve to it.
func sonameLinks(lib string) []string {
	entries, err := os.ReadDir(filepath.Dir(lib))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(lib), e.Name()))
		if err == nil && target == lib {
			out = append(out, e.Name())
		}
	}
	return out
}

// hostPaths makes paths read below Root paths on the host, which is where
// the container runtime reads them.
func (p *Preparer) hostPaths(edits *cdispec.ContainerEdits) {
	for _, n := range edits.DeviceNodes {
		if n.HostPath != "" {
			n.HostPath = p.hostPath(n.HostPath)
		}
	}
	for _, m := range edits.Mounts {
		m.HostPath = p.hostPath(m.HostPath)
	}
}

func (p *Preparer) hostPath(path string) string {
	root := filepath.Clean(p.opts.Root)
	if root == "/" {
		return path
	}
	if rel, err := filepath.Rel(root, path); err == nil && !strings.HasPrefix(rel, "..") {
		return "/" + rel
	}
	return path
}

// deviceNode is a host device node below Root, checked to exist.
func (p *Preparer) deviceNode(path string) (*cdispec.DeviceNode, error) {
	host := filepath.Join(p.opts.Root, path)
	if _, err := os.Stat(host); err != nil {
		return nil, fmt.Errorf("device node: %w", err)
	}
	return &cdispec.DeviceNode{Path: path, HostPath: p.hostPath(host)}, nil
}

// nvcdiLogger sends nvcdi's messages to the agent's log, below the default
// verbosity: it reports every optional file it does not find.
type nvcdiLogger struct{ l logr.Logger }

func (n nvcdiLogger) Debugf(f string, a ...any) { n.l.V(5).Info(fmt.Sprintf(f, a...), "from", "nvcdi") }
func (n nvcdiLogger) Tracef(f string, a ...any) { n.l.V(6).Info(fmt.Sprintf(f, a...), "from", "nvcdi") }
func (n nvcdiLogger) Infof(f string, a ...any)  { n.l.V(4).Info(fmt.Sprintf(f, a...), "from", "nvcdi") }
func (n nvcdiLogger) Warningf(f string, a ...any) {
	n.l.V(3).Info(fmt.Sprintf(f, a...), "from", "nvcdi")
}
func (n nvcdiLogger) Errorf(f string, a ...any) {
	n.l.Error(fmt.Errorf(f, a...), "nvcdi", "from", "nvcdi")
}

package prep

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/gpu/nvcaps"
)

// migCapNodes are the /dev/nvidia-caps nodes that give access to the GPU
// instance and its compute instance. The driver lists each one's minor and
// mode in /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]
// but makes no node; nvidia-modprobe or the GPU operator would, and neither
// runs in the agent's container, so the agent makes them below Root.
func (p *Preparer) migCapNodes(ctx context.Context, rec migRecord) ([]*cdispec.DeviceNode, error) {
	made, err := nvcaps.Ensure(ctx, p.opts.Root,
		nvcaps.GPUInstance(rec.ParentMinor, rec.GPUInstanceID),
		nvcaps.ComputeInstance(rec.ParentMinor, rec.GPUInstanceID, rec.ComputeInstanceID))
	if err != nil {
		return nil, err
	}
	var nodes []*cdispec.DeviceNode
	for _, n := range made {
		node, err := p.deviceNode(n.Path)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

// uvmNodes are the unified-memory nodes every CUDA process opens (minor 0
// and 1 of the nvidia-uvm driver's major), as nvidia-modprobe makes them.
var uvmNodes = []struct {
	name  string
	minor uint32
}{{"nvidia-uvm", 0}, {"nvidia-uvm-tools", 1}}

// ensureUVMNodes makes /dev/nvidia-uvm and /dev/nvidia-uvm-tools below the
// root where the nvidia-uvm module is loaded and they are missing: the CDI
// library gives a container only the nodes it finds, and a host where
// nothing ran nvidia-modprobe (no CUDA process has run on it yet, or the
// module was loaded by hand) has the module without the nodes, so every
// container's cuInit failed. Where the module is not loaded it says so:
// the containers then get no UVM nodes, and CUDA in them fails.
func (p *Preparer) ensureUVMNodes() {
	root := p.opts.Root
	major, err := nvcaps.CharMajor(root, "nvidia-uvm")
	if err != nil {
		if !p.uvmUnloaded.Swap(true) {
			p.opts.Logger.Error(err, "The nvidia-uvm module is not loaded: GPU containers get no /dev/nvidia-uvm, and CUDA in them fails until it is (nvidia-modprobe -u -c=0)")
		}
		return
	}
	p.uvmUnloaded.Store(false)
	for _, n := range uvmNodes {
		path := filepath.Join(root, "dev", n.name)
		if _, err := os.Lstat(path); err == nil {
			continue
		}
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, n.minor))); err != nil && !errors.Is(err, unix.EEXIST) {
			p.opts.Logger.Error(err, "Making a UVM device node", "path", path)
			continue
		}
		// Mknod's mode passes the umask.
		if err := os.Chmod(path, 0o666); err != nil { //nolint:gosec // G302: a device node every CUDA process opens, as nvidia-modprobe makes it
			p.opts.Logger.Error(err, "Mode of a UVM device node", "path", path)
		}
		p.opts.Logger.Info("Made a missing UVM device node", "path", path, "major", major, "minor", n.minor)
	}
}

package prep

import (
	"context"

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

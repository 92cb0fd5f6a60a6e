package prep

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/carve-dra/carve/gpu"
)

// destroyMIG destroys the compute instances and the GPU instance at the
// record's placement. An instance already gone is success, and so is one
// whose GPU instance id is not wantGI where that is given: the instance
// recorded is gone, and the one at its placement now is another's.
func (p *Preparer) destroyMIG(ctx context.Context, device string, rec migRecord, wantGI *uint32) error {
	var other *uint32
	err := p.opts.NVML.Do(ctx, "destroy MIG instance", func(l gpu.Library) error {
		dev, err := parent(l, rec)
		if err != nil {
			return err
		}
		info, err := profileInfo(dev, rec)
		if err != nil {
			return err
		}
		gi, err := findInstance(dev, info, rec.PlacementStart)
		if err != nil || gi == nil {
			return err
		}
		if wantGI != nil {
			if giInfo, ret := gi.GetInfo(); ret != nvml.SUCCESS {
				return fmt.Errorf("GPU instance info at placement %d: %s", rec.PlacementStart, nvml.ErrorString(ret))
			} else if giInfo.Id != *wantGI {
				other = &giInfo.Id
				return nil
			}
		}
		return destroyInstance(gi, rec.PlacementStart)
	})
	if err != nil {
		return fmt.Errorf("MIG device %s: %w", device, err)
	}
	if other != nil {
		p.opts.Logger.Info("The MIG instance recorded is gone; the GPU instance now at its placement is another and is left in place",
			"device", device, "parent", rec.ParentUUID, "placement", rec.PlacementStart, "recordedGPUInstance", *wantGI, "foundGPUInstance", *other)
	}
	p.forget(rec)
	return nil
}

// destroyInstance destroys a GPU instance's compute instances, then it.
func destroyInstance(gi nvml.GpuInstance, start int) error {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&ciInfo)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("destroy compute instance: %s", nvml.ErrorString(ret))
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroy GPU instance at placement %d: %s", start, nvml.ErrorString(ret))
	}
	return nil
}

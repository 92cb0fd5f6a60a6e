package prep

import (
	"context"
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
)

// migRecord is the undo record of a MIG allocation: enough to find its
// instances again. ProfileID is NVML's Id of the profile, which instances
// carry; ProfileIndex is the index NVML's profile info is asked by, nil in
// records written before carve kept it.
type migRecord struct {
	ParentUUID        string `json:"parentUUID"`
	ParentMinor       int    `json:"parentMinor"`
	ProfileID         int    `json:"profileId"`
	ProfileIndex      *int   `json:"profileIndex,omitempty"`
	PlacementStart    int    `json:"placementStart"`
	PlacementSize     int    `json:"placementSize"`
	GPUInstanceID     uint32 `json:"gpuInstanceId"`
	ComputeInstanceID uint32 `json:"computeInstanceId"`
}

// key names the record's instance as NVML's instance list does.
func (r migRecord) key() string { return instanceKey(r.ParentUUID, r.ProfileID, r.PlacementStart) }

func recordFor(g slices.GPU) migRecord {
	index := g.MIG.Profile.ProfileIndex
	return migRecord{ParentUUID: g.Device.UUID, ParentMinor: g.Device.Minor, ProfileID: g.MIG.Profile.ProfileID,
		ProfileIndex: &index, PlacementStart: g.MIG.Placement.Start, PlacementSize: g.MIG.Placement.Size}
}

// profileInfo asks NVML for the record's profile by its index, and checks
// that the answer is the profile of the record's Id: a card whose profiles
// changed (another driver) must not get an instance of another profile. A
// record without an index finds it by the Id.
func profileInfo(dev nvml.Device, rec migRecord) (nvml.GpuInstanceProfileInfo, error) {
	if rec.ProfileIndex != nil {
		info, ret := dev.GetGpuInstanceProfileInfo(*rec.ProfileIndex)
		if ret != nvml.SUCCESS {
			return info, fmt.Errorf("profile index %d (Id %d): %s", *rec.ProfileIndex, rec.ProfileID, nvml.ErrorString(ret))
		}
		if int(info.Id) != rec.ProfileID {
			return info, fmt.Errorf("profile index %d is Id %d on %s, not the Id %d published", *rec.ProfileIndex, info.Id, rec.ParentUUID, rec.ProfileID)
		}
		return info, nil
	}
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		if info, ret := dev.GetGpuInstanceProfileInfo(index); ret == nvml.SUCCESS && int(info.Id) == rec.ProfileID {
			return info, nil
		}
	}
	return nvml.GpuInstanceProfileInfo{}, fmt.Errorf("no GPU instance profile has Id %d on %s", rec.ProfileID, rec.ParentUUID)
}

// prepareMIG creates the GPU instance at the allocated placement and a
// compute instance filling it, then gives the container the parent's
// device nodes and the instance's capability nodes.
func (p *Preparer) prepareMIG(ctx context.Context, a prepare.Allocation, g slices.GPU) (prepare.Prepared, error) {
	rec := recordFor(g)
	if holder, ok := p.heldByOther(rec, a.ClaimUID); ok {
		return prepare.Prepared{}, fmt.Errorf("MIG device %s: placement %d of profile %s on %s is held by an instance of %s, not made for this claim; left in place",
			a.Device, rec.PlacementStart, g.MIG.Profile.Name, rec.ParentUUID, holder)
	}
	// Recorded on the node before it exists: a crash once NVML made it
	// must leave what finds it again without the checkpoint. A record
	// there already is a retry's, and is kept if this one fails.
	node := nodeRecord{ClaimUID: a.ClaimUID, Device: a.Device, Instance: rec}
	recorded := p.nodeRecordExists(a.ClaimUID, a.Device)
	if err := p.writeNodeRecord(node); err != nil {
		return prepare.Prepared{}, err
	}
	// Owned before it exists: a rescan that sees it must not take its
	// placement out of the pool.
	p.own(rec, a.ClaimUID)
	crashPoint("mig-recorded")
	var migUUID string
	err := p.opts.NVML.Do(ctx, "create MIG instance", func(l gpu.Library) error {
		var err error
		migUUID, err = createMIG(l, &rec, g.MIG.Profile.Name)
		return err
	})
	if err != nil {
		p.forget(rec)
		if !recorded {
			if rerr := p.removeNodeRecord(a.ClaimUID, a.Device); rerr != nil {
				p.opts.Logger.Error(rerr, "The node record of a MIG instance never made is kept; the next start removes it", "device", a.Device, "claimUID", a.ClaimUID)
			}
		}
		return prepare.Prepared{}, fmt.Errorf("MIG device %s: %w", a.Device, err)
	}
	crashPoint("mig-created")
	node.Instance, node.IDsKnown = rec, true
	if err := p.writeNodeRecord(node); err != nil {
		// The record written first finds the instance by its placement;
		// only the ids that check it is the same one are missing.
		p.opts.Logger.Error(err, "Recording a MIG instance's ids; its record names it by placement only", "device", a.Device, "claimUID", a.ClaimUID)
	}
	undo, _ := jsonMarshal(rec)
	edits, err := p.migEdits(ctx, rec)
	if err != nil {
		// The instance exists: the driver rolls back through Unprepare
		// with this record.
		return prepare.Prepared{Undo: undo}, fmt.Errorf("MIG device %s: %w", a.Device, err)
	}
	edits.Env = append(edits.Env,
		a.EnvPrefix()+"MIG_PARENT_UUID="+rec.ParentUUID,
		a.EnvPrefix()+"MIG_PROFILE="+g.MIG.Profile.Name,
		a.EnvPrefix()+"MIG_GPU_INSTANCE_ID="+strconv.Itoa(int(rec.GPUInstanceID)),
		a.EnvPrefix()+"MIG_COMPUTE_INSTANCE_ID="+strconv.Itoa(int(rec.ComputeInstanceID)))
	if migUUID != "" {
		// What CUDA_VISIBLE_DEVICES and DCGM name the instance by.
		edits.Env = append(edits.Env, a.EnvPrefix()+"MIG_UUID="+migUUID)
	}
	return prepare.Prepared{Edits: edits, Undo: undo}, nil
}

// createMIG makes, under NVML's lock, the record's GPU instance and the
// compute instance filling it, sets their ids in the record, and returns
// the MIG device's UUID ("" where NVML does not answer it: the instance is
// made all the same).
func createMIG(l gpu.Library, rec *migRecord, profile string) (string, error) {
	dev, err := createInstances(l, rec, profile)
	if err != nil {
		return "", err
	}
	return migDeviceUUID(dev, rec.GPUInstanceID, rec.ComputeInstanceID), nil
}

// migDeviceUUID is the UUID of the MIG device of the GPU and compute
// instance ids on dev, "" where NVML has none: NVML finds MIG devices by
// index, not by their instances' ids.
func migDeviceUUID(dev nvml.Device, gi, ci uint32) string {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return ""
	}
	for i := 0; i < n; i++ {
		m, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		giID, ret1 := m.GetGpuInstanceId()
		ciID, ret2 := m.GetComputeInstanceId()
		if ret1 != nvml.SUCCESS || ret2 != nvml.SUCCESS || giID != int(gi) || ciID != int(ci) {
			continue
		}
		if uuid, ret := m.GetUUID(); ret == nvml.SUCCESS {
			return uuid
		}
	}
	return ""
}

// createInstances makes the record's GPU instance and the compute
// instance filling it, sets their ids in the record, and returns the
// parent GPU.
func createInstances(l gpu.Library, rec *migRecord, profile string) (nvml.Device, error) {
	dev, err := parent(l, *rec)
	if err != nil {
		return nil, err
	}
	info, err := profileInfo(dev, *rec)
	if err != nil {
		return nil, err
	}
	if gi, _ := findInstance(dev, info, rec.PlacementStart); gi != nil {
		return nil, fmt.Errorf("a GPU instance already holds placement %d of profile %s on %s, not made for this claim; left in place", rec.PlacementStart, profile, rec.ParentUUID)
	}
	placement := nvml.GpuInstancePlacement{Start: uint32(rec.PlacementStart), Size: uint32(rec.PlacementSize)}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &placement)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create GPU instance %s at placement %d+%d: %s", profile, rec.PlacementStart, rec.PlacementSize, nvml.ErrorString(ret))
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		err := fmt.Errorf("GPU instance info: %s", nvml.ErrorString(ret))
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("%w; and destroying the GPU instance: %s", err, nvml.ErrorString(ret))
		}
		return nil, err
	}
	rec.GPUInstanceID = giInfo.Id
	ci, err := createComputeInstance(gi, info.SliceCount)
	if err != nil {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("%w; and destroying the GPU instance: %s", err, nvml.ErrorString(ret))
		}
		return nil, err
	}
	rec.ComputeInstanceID = ci
	return dev, nil
}

// createComputeInstance makes the compute instance that fills a GPU
// instance of the given slices, and returns its id.
func createComputeInstance(gi nvml.GpuInstance, slices uint32) (uint32, error) {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS || info.SliceCount != slices {
			continue
		}
		ci, ret := gi.CreateComputeInstance(&info)
		if ret != nvml.SUCCESS {
			return 0, fmt.Errorf("create compute instance profile %d: %s", id, nvml.ErrorString(ret))
		}
		ciInfo, ret := ci.GetInfo()
		if ret != nvml.SUCCESS {
			err := fmt.Errorf("compute instance info: %s", nvml.ErrorString(ret))
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return 0, fmt.Errorf("%w; and destroying the compute instance: %s", err, nvml.ErrorString(ret))
			}
			return 0, err
		}
		return ciInfo.Id, nil
	}
	return 0, fmt.Errorf("no compute-instance profile fills a %d-slice GPU instance", slices)
}

func parent(l gpu.Library, rec migRecord) (nvml.Device, error) {
	dev, ret := l.DeviceGetHandleByUUID(rec.ParentUUID)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %s", rec.ParentUUID, nvml.ErrorString(ret))
	}
	if mode, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || mode != nvml.DEVICE_MIG_ENABLE {
		return nil, fmt.Errorf("GPU %s: MIG is not enabled", rec.ParentUUID)
	}
	return dev, nil
}

// findInstance returns the GPU instance of the profile at the placement, or
// nil. NVML lists instances by the profile's Id, which the info carries.
func findInstance(dev nvml.Device, info nvml.GpuInstanceProfileInfo, start int) (nvml.GpuInstance, error) {
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("list GPU instances of profile Id %d: %s", info.Id, nvml.ErrorString(ret))
	}
	for _, gi := range gis {
		if i, ret := gi.GetInfo(); ret == nvml.SUCCESS && int(i.Placement.Start) == start {
			return gi, nil
		}
	}
	return nil, nil
}

// migEdits are the common driver edits, the parent GPU's device node, and
// the capability nodes of the GPU and compute instances.
func (p *Preparer) migEdits(ctx context.Context, rec migRecord) (cdispec.ContainerEdits, error) {
	edits, err := p.commonEdits(ctx)
	if err != nil {
		return edits, err
	}
	node, err := p.deviceNode(fmt.Sprintf("/dev/nvidia%d", rec.ParentMinor))
	if err != nil {
		return edits, err
	}
	edits.DeviceNodes = append(edits.DeviceNodes, node)
	caps, err := p.migCapNodes(ctx, rec)
	if err != nil {
		return edits, err
	}
	edits.DeviceNodes = append(edits.DeviceNodes, caps...)
	return edits, nil
}

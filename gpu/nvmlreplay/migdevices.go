package nvmlreplay

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// maxMIGDevices is what every MIG-capable card answers
// nvmlDeviceGetMaxMigDeviceCount with (the H100's record: 7).
const maxMIGDevices = 7

// migDevices makes a MIG-capable mock device answer for its MIG devices as
// a card does: one handle per compute instance, found by index among the
// GPU's (an index with none answers NOT_FOUND), each with a UUID of its
// own ("MIG-" and a UUID) and its GPU and compute instance ids. The mock
// has no MIG device handles; the UUIDs are derived from the parent's and
// the ids, so the same instance keeps its UUID.
func migDevices(m *server.Device) {
	var mu sync.Mutex
	handles := map[[2]uint32]*mock.Device{}
	m.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return maxMIGDevices, nvml.SUCCESS }
	m.GetMigDeviceHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		if index < 0 || index >= maxMIGDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		ids := computeInstances(m)
		if index >= len(ids) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		mu.Lock()
		defer mu.Unlock()
		key := ids[index]
		if h, ok := handles[key]; ok {
			return h, nvml.SUCCESS
		}
		uuid := migUUID(m.UUID, key[0], key[1])
		h := &mock.Device{
			GetUUIDFunc:                            func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
			GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return int(key[0]), nvml.SUCCESS },
			GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return int(key[1]), nvml.SUCCESS },
			GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return m, nvml.SUCCESS },
		}
		handles[key] = h
		return h, nvml.SUCCESS
	}
}

// computeInstances are the GPU's compute instances as (GPU instance id,
// compute instance id), in order.
func computeInstances(m *server.Device) [][2]uint32 {
	var out [][2]uint32
	m.RLock()
	for gi := range m.GpuInstances {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			out = append(out, [2]uint32{gi.Info.Id, ci.Info.Id})
		}
		gi.RUnlock()
	}
	m.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}

// migUUID is a MIG device's UUID in NVML's form, derived from its parent's
// and its ids.
func migUUID(parent string, gi, ci uint32) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%d", parent, gi, ci)))
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

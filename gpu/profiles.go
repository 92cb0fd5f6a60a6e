package gpu

import (
	"fmt"
	"math"
	"sort"
	"strings"

	nvlib "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// ComputeProfileBySlices is the compute-instance profile that fills a GPU
// instance of that many slices.
var ComputeProfileBySlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// profiles is go-nvlib's MIG profile naming; NewMigProfile asks NVML
// nothing, so no library is needed behind it.
var profiles = nvlib.New(nil)

// ProfileName names a GPU-instance profile as nvidia-smi does, for where the
// driver gives no name (every profile while MIG is disabled):
// "<slices>g.<GB>gb" with the attributes of the profile's index ("+me",
// "+me.all", "+gfx", "-me"), the memory being the profile's share of the
// GPU rounded up to eighths (go-nvlib's rule: 9984 MB of an 80 GB H100 is
// 10gb). The index decides the attributes, so that 1g.10gb+me is never
// named 1g.10gb.
func ProfileName(index, sliceCount int, memoryMB, totalMemoryBytes uint64) string {
	info := nvlib.MigProfileInfo{C: sliceCount, G: sliceCount, GB: int(math.Round(float64(memoryMB) / 1024))}
	ci, ok := ComputeProfileBySlices[sliceCount]
	if !ok {
		ci = nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	}
	// go-nvlib divides by the GPU's memory: a zero total would be NaN.
	total := totalMemoryBytes
	if total == 0 {
		total = memoryMB << 20
	}
	if p, err := profiles.NewMigProfile(index, ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, memoryMB, total); err == nil {
		got := p.GetInfo()
		info.Attributes, info.NegAttributes = got.Attributes, got.NegAttributes
		if totalMemoryBytes > 0 {
			info.GB = got.GB
		}
	} else if index == nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX {
		// go-nvlib v0.13 names the other graphics profiles only.
		info.Attributes = []string{nvlib.AttributeGraphics}
	}
	return info.String()
}

// attributes is the part of a profile name after its memory: "+me", "".
func attributes(name string) string {
	if i := strings.Index(name, "gb"); i >= 0 {
		return name[i+len("gb"):]
	}
	return ""
}

// DeriveProfileIndices fills in the index of every profile a replay file
// gives without one (files written before carve recorded it), the way NVML
// defines the profiles: by slice count and the name's attributes ("+me" is
// the slice count's REV1 index, "+gfx", "-me" and "+me.all" the GFX, NO_ME
// and ALL_ME ones), a 1-slice profile with about twice the memory of the
// smallest 1-slice one being 1_SLICE_REV2. A profile whose index another
// already holds, with fewer instances, is the media-extension revision of
// it: a GPU has one set of media extensions. Profile names are set to
// match the index. It returns what it had to guess.
func DeriveProfileIndices(d *nvmlinfo.Device) []string {
	var notes []string
	taken := map[int]bool{}
	var todo []int
	for i, p := range d.MIGProfiles {
		if p.ProfileIndex == nvmlinfo.NoProfileIndex {
			todo = append(todo, i)
		} else {
			taken[p.ProfileIndex] = true
		}
	}
	if len(todo) == 0 {
		return nil
	}
	smallest := uint64(math.MaxUint64)
	for _, p := range d.MIGProfiles {
		if p.SliceCount == 1 {
			smallest = min(smallest, p.MemorySizeMB)
		}
	}
	// Those with more instances first: of two profiles alike but for
	// their count, the one the GPU can hold fewer of takes the revision.
	sort.SliceStable(todo, func(a, b int) bool {
		return d.MIGProfiles[todo[a]].InstanceCount > d.MIGProfiles[todo[b]].InstanceCount
	})
	for _, i := range todo {
		p := &d.MIGProfiles[i]
		index, note := deriveIndex(*p, d.MemoryTotalBytes, smallest, taken)
		if note != "" {
			notes = append(notes, fmt.Sprintf("GPU %d (%s) profile Id %d (%q): %s", d.Index, d.UUID, p.ProfileID, p.Name, note))
		}
		taken[index] = true
		p.ProfileIndex = index
		if name := ProfileName(index, p.SliceCount, p.MemorySizeMB, d.MemoryTotalBytes); attributes(name) != attributes(p.Name) {
			p.Name = name
		}
	}
	return notes
}

// deriveIndex picks the index of one profile; the note says where it was
// a guess.
func deriveIndex(p nvmlinfo.MIGProfile, total, smallest uint64, taken map[int]bool) (int, string) {
	var same, free []int
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		name := ProfileName(index, p.SliceCount, p.MemorySizeMB, total)
		if !sameSlices(index, p.SliceCount) {
			continue
		}
		if attributes(name) == attributes(p.Name) {
			same = append(same, index)
		}
		if !taken[index] {
			free = append(free, index)
		}
	}
	if p.SliceCount == 1 && attributes(p.Name) == "" && 2*p.MemorySizeMB > 3*smallest && !taken[nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2] {
		return nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ""
	}
	for _, index := range same {
		if index != nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2 && !taken[index] {
			return index, ""
		}
	}
	for _, index := range free {
		if attributes(ProfileName(index, p.SliceCount, p.MemorySizeMB, total)) == "+"+nvlib.AttributeMediaExtensions {
			return index, fmt.Sprintf("its name's index is another profile's; taken as the media-extension revision (index %d)", index)
		}
	}
	return p.ProfileID, "no index fits its slices and name; its Id is taken as its index, as go-nvml's mock numbers profiles"
}

// sameSlices reports whether NVML's profile index is one of that many
// slices.
func sameSlices(index, sliceCount int) bool {
	if index == nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX {
		return sliceCount == 3
	}
	p, err := profiles.NewMigProfile(index, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, 1, 1<<30)
	return err == nil && p.GetInfo().G == sliceCount
}

// MediaExtensionIndex reports whether NVML's profile index is a
// media-extension one ("+me", "+me.all"), by go-nvlib's naming of it.
func MediaExtensionIndex(index int) bool {
	a := attributes(ProfileName(index, 1, 1024, 8<<30))
	return a == "+"+nvlib.AttributeMediaExtensions || a == "+"+nvlib.AttributeMediaExtensionsAll
}

// EachGPUInstance calls fn with each GPU instance NVML lists on dev, with
// the profile it was asked by (walking NVML's profile indices; each answers
// its profile's Id) and its info, until fn returns false. A profile or an
// instance NVML does not answer for is passed over.
func EachGPUInstance(dev nvml.Device, fn func(profile nvml.GpuInstanceProfileInfo, info nvml.GpuInstanceInfo) bool) {
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		profile, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&profile)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			if info, ret := gi.GetInfo(); ret == nvml.SUCCESS && !fn(profile, info) {
				return
			}
		}
	}
}

package plan

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
	"github.com/carve-dra/carve/scheduler/pkg/shareplugin"
	"github.com/carve-dra/carve/slices/names"
)

// Result is a plan: where each claim goes and what every device then holds.
type Result struct {
	Placements []Placement `json:"placements"`
	Devices    []DeviceUse `json:"devices"`
}

// DeviceUse is one device after the plan.
type DeviceUse struct {
	Node      string `json:"node"`
	Driver    string `json:"driver"`
	Pool      string `json:"pool"`
	Device    string `json:"device"`
	Kind      string `json:"kind,omitempty"`
	Exclusive bool   `json:"exclusive,omitempty"`
	Shares    int    `json:"shares,omitempty"`
	// Capacity is used and total per capacity name, for shareable devices.
	Capacity map[string]CapacityUse `json:"capacity,omitempty"`
}

// CapacityUse is how much of one capacity is consumed.
type CapacityUse struct {
	Used  resource.Quantity `json:"used"`
	Total resource.Quantity `json:"total"`
}

// InUse is true when the device holds an exclusive allocation or a share.
func (d DeviceUse) InUse() bool { return d.Exclusive || d.Shares > 0 }

func deviceUse(s *structured.AllocatedState, slices []*resourceapi.ResourceSlice) []DeviceUse {
	shares := map[structured.DeviceID]int{}
	for id := range s.AllocatedSharedDeviceIDs {
		shares[id.GetDeviceID()]++
	}
	var out []DeviceUse
	for _, sl := range slices {
		node := ""
		if sl.Spec.NodeName != nil {
			node = *sl.Spec.NodeName
		}
		for _, d := range sl.Spec.Devices {
			id := structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)
			u := DeviceUse{Node: node, Driver: sl.Spec.Driver, Pool: sl.Spec.Pool.Name, Device: d.Name,
				Exclusive: s.AllocatedDevices.Has(id), Shares: shares[id]}
			if a, ok := d.Attributes[names.AttrKind]; ok && a.StringValue != nil {
				u.Kind = *a.StringValue
			}
			if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations && len(d.Capacity) > 0 {
				u.Capacity = map[string]CapacityUse{}
				for n, c := range d.Capacity {
					used := resource.Quantity{}
					if q := s.AggregatedCapacity[id][n]; q != nil {
						used = q.DeepCopy()
					}
					u.Capacity[string(n)] = CapacityUse{Used: used, Total: c.Value.DeepCopy()}
				}
			}
			out = append(out, u)
		}
	}
	return out
}

// fillScore ranks an allocation by the mean fill of its devices once it is
// made (an exclusive device counts as full), under strategy, from 0 to 100.
func fillScore(s *structured.AllocatedState, slices []*resourceapi.ResourceSlice, a resourceapi.AllocationResult, strategy sharefit.Strategy) int64 {
	var sum float64
	for _, r := range a.Devices.Results {
		sum += fill(s, slices, r)
	}
	f := 0.0
	if n := len(a.Devices.Results); n > 0 {
		f = sum / float64(n)
	}
	if strategy == sharefit.LeastAllocated {
		f = 1 - f
	}
	return int64(f*1000 + 0.5)
}

func fill(s *structured.AllocatedState, slices []*resourceapi.ResourceSlice, r resourceapi.DeviceRequestAllocationResult) float64 {
	if r.ShareID == nil {
		return 1
	}
	id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
	d := findDevice(slices, r)
	if d == nil || len(d.Capacity) == 0 {
		return 1
	}
	var sum float64
	for n, c := range d.Capacity {
		used := float64(0)
		if q := s.AggregatedCapacity[id][n]; q != nil {
			used = float64(q.Value())
		}
		if q, ok := r.ConsumedCapacity[n]; ok {
			used += float64(q.Value())
		}
		if t := float64(c.Value.Value()); t > 0 {
			sum += used / t
		}
	}
	return sum / float64(len(d.Capacity))
}

func findDevice(slices []*resourceapi.ResourceSlice, r resourceapi.DeviceRequestAllocationResult) *resourceapi.Device {
	for _, sl := range slices {
		if sl.Spec.Driver != r.Driver || sl.Spec.Pool.Name != r.Pool {
			continue
		}
		for i := range sl.Spec.Devices {
			if sl.Spec.Devices[i].Name == r.Device {
				return &sl.Spec.Devices[i]
			}
		}
	}
	return nil
}

// withDefaultClasses adds, for every class a claim names that the input
// lacks and that looks like carve's (<kind>.<driver>), the class carve's
// chart installs: driver and kind attribute.
func withDefaultClasses(have []*resourceapi.DeviceClass, claims []*resourceapi.ResourceClaim) []*resourceapi.DeviceClass {
	known := map[string]bool{}
	for _, c := range have {
		known[c.Name] = true
	}
	out := append([]*resourceapi.DeviceClass(nil), have...)
	for _, cl := range claims {
		for _, r := range cl.Spec.Devices.Requests {
			classes := []string{}
			if r.Exactly != nil {
				classes = append(classes, r.Exactly.DeviceClassName)
			}
			for _, s := range r.FirstAvailable {
				classes = append(classes, s.DeviceClassName)
			}
			for _, n := range classes {
				kind, driver, ok := strings.Cut(n, ".")
				if known[n] || !ok || driver != shareplugin.DefaultDriverName {
					continue
				}
				known[n] = true
				out = append(out, &resourceapi.DeviceClass{
					ObjectMeta: metav1.ObjectMeta{Name: n},
					Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
						Expression: `device.driver == "` + driver + `" && device.attributes["` + driver + `"].` + names.AttrKind + ` == "` + kind + `"`,
					}}}},
				})
			}
		}
	}
	return out
}

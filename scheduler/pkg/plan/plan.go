// Package plan answers "where would these claims be allocated?" without a
// scheduler: it runs the structured allocator of
// k8s.io/dynamic-resource-allocation over ResourceSlices and ResourceClaims
// (from files or a cluster), places each unallocated claim in turn on the
// node ShareFit's strategy prefers, and reports the resulting use of every
// device.
package plan

import (
	"context"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
)

// Input is what a plan is made from.
type Input struct {
	Slices  []*resourceapi.ResourceSlice
	Claims  []*resourceapi.ResourceClaim
	Classes []*resourceapi.DeviceClass
}

// Placement is where one claim went, or why it went nowhere.
type Placement struct {
	Claim string `json:"claim"`
	// Node is empty when the claim fits no node (Reason says so) or was
	// allocated already (Allocated).
	Node      string                                      `json:"node,omitempty"`
	Allocated bool                                        `json:"allocated,omitempty"`
	Reason    string                                      `json:"reason,omitempty"`
	Devices   []resourceapi.DeviceRequestAllocationResult `json:"devices,omitempty"`
}

// Features is what the allocator may use: the DRA features on in v1.37.
var Features = structured.Features{
	ConsumableCapacity:   true,
	PartitionableDevices: true,
	PrioritizedList:      true,
	DeviceTaints:         true,
	AdminAccess:          true,
}

// Run places every unallocated claim of in, in order, on the node whose
// allocation strategy ranks highest (ties go to the first node by name),
// and returns the placements and the use of every device afterwards.
func Run(ctx context.Context, in Input, strategy sharefit.Strategy) (*Result, error) {
	logger := klog.FromContext(ctx)
	state := allocatedState(in.Claims)
	nodes := nodeNames(in.Slices)
	classes := classLister(withDefaultClasses(in.Classes, in.Claims))
	cache := cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})
	res := &Result{}
	for _, claim := range in.Claims {
		name := claim.Namespace + "/" + claim.Name
		if claim.Status.Allocation != nil {
			res.Placements = append(res.Placements, Placement{Claim: name, Allocated: true, Node: allocatedNode(claim.Status.Allocation), Devices: claim.Status.Allocation.Devices.Results})
			continue
		}
		alloc, err := structured.NewAllocator(ctx, Features, *state, classes, in.Slices, cache)
		if err != nil {
			return nil, fmt.Errorf("allocator for claim %s: %w", name, err)
		}
		best, bestScore := -1, int64(-1)
		var bestResult resourceapi.AllocationResult
		var lastErr error
		for i, node := range nodes {
			results, err := alloc.Allocate(klog.NewContext(ctx, klog.LoggerWithValues(logger, "node", node)), node, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				lastErr = err
				continue
			}
			if len(results) != 1 {
				continue
			}
			score := fillScore(state, in.Slices, results[0], strategy)
			if score > bestScore {
				best, bestScore, bestResult = i, score, results[0]
			}
		}
		if best < 0 {
			reason := "no node has devices for it"
			if lastErr != nil {
				reason = lastErr.Error()
			}
			res.Placements = append(res.Placements, Placement{Claim: name, Reason: reason})
			continue
		}
		apply(state, bestResult)
		logger.V(4).Info("Placed claim", "claim", name, "node", nodes[best].Name, "score", bestScore)
		res.Placements = append(res.Placements, Placement{Claim: name, Node: nodes[best].Name, Devices: bestResult.Devices.Results})
	}
	res.Devices = deviceUse(state, in.Slices)
	return res, nil
}

// allocatedState is what the claims' existing allocations hold, gathered as
// the scheduler's claim tracker does.
func allocatedState(claims []*resourceapi.ResourceClaim) *structured.AllocatedState {
	s := &structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation != nil {
			apply(s, *c.Status.Allocation)
		}
	}
	return s
}

// apply records an allocation in the state.
func apply(s *structured.AllocatedState, a resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			s.AllocatedDevices.Insert(id)
			continue
		}
		s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// nodeNames are the nodes the slices name, sorted, as Node objects for the
// allocator (which matches slices by node name).
func nodeNames(slices []*resourceapi.ResourceSlice) []*v1.Node {
	names := sets.New[string]()
	for _, s := range slices {
		if s.Spec.NodeName != nil {
			names.Insert(*s.Spec.NodeName)
		}
	}
	var out []*v1.Node
	for _, n := range sets.List(names) {
		out = append(out, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}}})
	}
	return out
}

// allocatedNode is the node an allocation is bound to, where it says.
func allocatedNode(a *resourceapi.AllocationResult) string {
	if a.NodeSelector == nil {
		return ""
	}
	for _, t := range a.NodeSelector.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// classes is a DeviceClassLister over a fixed set.
type classes map[string]*resourceapi.DeviceClass

func classLister(list []*resourceapi.DeviceClass) classes {
	c := classes{}
	for _, d := range list {
		c[d.Name] = d
	}
	return c
}

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, d := range c {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if d, ok := c[name]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

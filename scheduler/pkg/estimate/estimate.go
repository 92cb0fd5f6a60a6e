// Package estimate predicts, for one pod, which device of a DRA driver each
// of the pod's device requests would get on a node, and how full that device
// would then be.
//
// It is the cheap bound carve's score plugins rank nodes by. The upstream
// DynamicResources plugin runs the structured allocator for every node in
// Filter but keeps the result in private cycle state; running the allocator
// a second time per node would double the scheduler's DRA cost. Instead the
// estimate repeats the allocator's first-fit choice: on each node, in the
// order the allocator walks devices (pools by name, slices by name, devices
// in slice order), the first device of the driver that passes the request's
// and its class's CEL selectors and is free for it. A device that allows
// multiple allocations is free while every capacity, after the device's
// request policy, has room; any other device while nothing holds it. The
// allocator's state comes from a ledger that counts what it counts.
//
// What it leaves out (device taints, shared counters, binding conditions,
// constraints across requests) can make it name a device the allocator
// would not take; the scores only rank nodes that DynamicResources has
// already found feasible, so a wrong guess costs placement quality, never
// correctness. ShareFit logs every such miss at V(3).
package estimate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/slices/names"
)

// Attribute names the topology of a device is read from.
const (
	AttrPCIeRoot       resourceapi.QualifiedName = deviceattribute.StandardDeviceAttributePCIeRoot
	AttrNUMANode       resourceapi.QualifiedName = names.AttrNUMANode
	AttrNUMANodeShared resourceapi.QualifiedName = deviceattribute.StandardDeviceAttributeNUMANode
)

// Request is one device request of one of the pod's claims: exactly one
// device of a class, a share of it where it names capacity.
type Request struct {
	// Claim is the index of the claim among the pod's claims with requests
	// the estimate follows; Topology compares devices across claims.
	Claim     int
	ClaimName string
	Name      string
	// Capacity is what the request asks of a device; nil where it names
	// none (a whole device, or a share at the device's defaults).
	Capacity map[resourceapi.QualifiedName]resource.Quantity
	// want is Capacity as integers, read once.
	want map[resourceapi.QualifiedName]int64
	sel  *selectors
}

// Share says whether the request asks for consumable capacity.
func (r *Request) Share() bool { return len(r.Capacity) > 0 }

// Device is a device of the driver, with what the score needs.
type Device struct {
	ID structured.DeviceID
	// Shareable devices allow multiple allocations; others go whole.
	Shareable bool
	// PCIeRoot and NUMANode are empty where the device does not say.
	PCIeRoot string
	NUMANode string
	caps     []deviceCap
	raw      *resourceapi.Device
	// matches caches whether the device passes a set of selectors.
	matches atomic.Pointer[[]selectorMatch]
}

// deviceCap is one capacity of a device, its total read once.
type deviceCap struct {
	name  resourceapi.QualifiedName
	total int64
	dc    resourceapi.DeviceCapacity
}

// Estimate holds what one scheduling cycle needs to predict picks on any node.
// Its requests and devices do not change once built, and Picks' memo is
// safe for concurrent use, so Score may read it from many goroutines.
type Estimate struct {
	Requests []Request
	// Claims is how many distinct claims the requests come from; Shares
	// how many requests ask for capacity.
	Claims, Shares int
	// Pending are the pod's unallocated claims with requests it follows.
	Pending []*resourceapi.ResourceClaim
	nodes   map[string][]*Device
	ledger  *Ledger
	// at is the ledger's mark the estimate reads it as of.
	at uint64
	// picked keeps Picks' answer per node.
	picked sync.Map
}

// Pick is the device a request would get on a node.
type Pick struct {
	Request *Request
	Device  *Device
	// Utilization is the device's mean fill over its capacities once this
	// request (and the pod's earlier requests on it) are placed, in [0, 1];
	// 1 for a device taken whole.
	Utilization float64
}

// Compute builds the estimate for pod from the scheduler's DRA state (the
// pod's claims, the slices) and the ledger of what allocations take, read
// as of mark at. It returns nil when the pod has no unallocated request it
// follows for driver.
func Compute(ctx context.Context, dra fwk.SharedDRAManager, ledger *Ledger, pod *v1.Pod, driver string, at uint64) (*Estimate, error) {
	logger := klog.FromContext(ctx)
	claims, err := podClaims(dra, pod)
	if err != nil {
		return nil, err
	}
	e := &Estimate{ledger: ledger, at: at}
	for _, claim := range claims {
		reqs, err := requests(dra.DeviceClasses(), claim, e.Claims)
		if err != nil {
			return nil, err
		}
		if len(reqs) == 0 {
			continue
		}
		for _, r := range reqs {
			if r.Share() {
				e.Shares++
			}
		}
		e.Requests = append(e.Requests, reqs...)
		e.Claims++
		e.Pending = append(e.Pending, claim)
	}
	if len(e.Requests) == 0 {
		return nil, nil
	}
	slices, err := dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, fmt.Errorf("list resource slices: %w", err)
	}
	e.nodes = indexFor(driver).byNode(slices)
	logger.V(5).Info("Device estimate", "pod", klog.KObj(pod), "requests", len(e.Requests), "shares", e.Shares, "claims", e.Claims, "nodes", len(e.nodes))
	return e, nil
}

// podClaims returns the pod's claims that still need an allocation. A claim
// not yet created from its template is skipped: DynamicResources keeps such
// a pod out of scheduling anyway.
func podClaims(dra fwk.SharedDRAManager, pod *v1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name := ""
		switch {
		case pc.ResourceClaimName != nil:
			name = *pc.ResourceClaimName
		default:
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					name = *st.ResourceClaimName
				}
			}
		}
		if name == "" {
			continue
		}
		claim, err := dra.ResourceClaims().Get(pod.Namespace, name)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s of pod %s: %w", pod.Namespace, name, pod.Name, err)
		}
		if claim.Status.Allocation == nil {
			out = append(out, claim)
		}
	}
	return out, nil
}

// requests lists the requests of claim the estimate follows, one entry per
// device they ask for: exact counts of one class's devices. All-devices
// requests, prioritized lists and admin access are left to the allocator.
func requests(classes fwk.DeviceClassLister, claim *resourceapi.ResourceClaim, index int) ([]Request, error) {
	var out []Request
	for _, r := range claim.Spec.Devices.Requests {
		x := r.Exactly
		if x == nil || x.AllocationMode == resourceapi.DeviceAllocationModeAll || (x.AdminAccess != nil && *x.AdminAccess) {
			continue
		}
		class, err := classes.Get(x.DeviceClassName)
		if err != nil {
			return nil, fmt.Errorf("device class %s of claim %s/%s: %w", x.DeviceClassName, claim.Namespace, claim.Name, err)
		}
		sel := selectorsFor(class, x.Selectors)
		var capacity map[resourceapi.QualifiedName]resource.Quantity
		if x.Capacity != nil && len(x.Capacity.Requests) > 0 {
			capacity = x.Capacity.Requests
		}
		count := int64(1)
		if x.Count > 0 {
			count = x.Count
		}
		for range count {
			want := make(map[resourceapi.QualifiedName]int64, len(capacity))
			for n, q := range capacity {
				want[n] = q.Value()
			}
			out = append(out, Request{Claim: index, ClaimName: claim.Namespace + "/" + claim.Name, Name: r.Name, Capacity: capacity, want: want, sel: sel})
		}
	}
	return out, nil
}

package sharefit

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

// cluster is n servers with about 2.4 shares held per node, and a pending
// pod with a GPU and a NIC share.
func cluster(n int) (*fixture.DRA, *v1.Pod, []fwk.NodeInfo) {
	dra := &fixture.DRA{Classes: fixture.Classes()}
	var nodes []fwk.NodeInfo
	for i := range n {
		name := fmt.Sprintf("node-%04d", i)
		dra.Slices = append(dra.Slices, fixture.Server(name, "100G", "80Gi"))
		ni := framework.NewNodeInfo()
		ni.SetNode(fixture.Node(name))
		nodes = append(nodes, ni)
		for j, dev := range []string{"gpu-0000-18-00-0", "nic-0000-19-00-0"} {
			var c *resourceapi.ResourceClaim
			if j == 0 {
				c = fixture.Claim("held", fmt.Sprintf("g%d", i), fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "8Gi"}))
			} else {
				c = fixture.Claim("held", fmt.Sprintf("n%d", i), fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: "10G"}))
			}
			fixture.Allocate(c, name, dev)
			dra.Claims = append(dra.Claims, c)
		}
	}
	dra.Claims = append(dra.Claims,
		fixture.Claim("default", "g", fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "8Gi"})),
		fixture.Claim("default", "n", fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: "10G"})))
	return dra, fixture.Pod("default", "p", "g", "n"), nodes
}

// BenchmarkScorePod is ShareFit's cost for one pod: PreScore and Score on
// every node (the estimate).
func BenchmarkScorePod(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			dra, pod, nodes := cluster(n)
			pl := newShareFit(dra.Base(Name), MostAllocated)
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				state := framework.NewCycleState()
				if st := pl.PreScore(ctx, state, pod, nodes); !st.IsSuccess() {
					b.Fatal(st)
				}
				for _, ni := range nodes {
					if _, st := pl.Score(ctx, state, pod, ni); !st.IsSuccess() {
						b.Fatal(st)
					}
				}
			}
		})
	}
}

// BenchmarkAllocatorPod is what scoring by the allocator's own answer would
// cost for the same pod: structured.NewAllocator and Allocate on every node,
// as DynamicResources already does once in Filter.
func BenchmarkAllocatorPod(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			dra, _, nodes := cluster(n)
			claims := dra.Claims[len(dra.Claims)-2:]
			state, _ := dra.ResourceClaims().GatherAllocatedState()
			cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
			features := structured.Features{ConsumableCapacity: true, PartitionableDevices: true, PrioritizedList: true}
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				alloc, err := structured.NewAllocator(ctx, features, *state, dra.DeviceClasses(), dra.Slices, cache)
				if err != nil {
					b.Fatal(err)
				}
				for _, ni := range nodes {
					res, err := alloc.Allocate(ctx, ni.Node(), claims)
					if err != nil || len(res) != 2 {
						b.Fatalf("allocate on %s: %v, %d results", ni.Node().Name, err, len(res))
					}
				}
			}
		})
	}
}

// BenchmarkAllocatorUnusedDevice measures what packing costs
// DynamicResources' Filter in v1.37.0, apart from anything carve runs: the
// allocator trying one pod's GPU and NIC shares on a node whose devices are
// unused, against a node whose devices already hold shares, with more
// shares held elsewhere in the cluster. For a shareable device that holds
// no capacity, the allocator's deviceCapacityInUse walks every allocated
// share ID in the cluster, so the unused node's cost grows with the
// cluster's shares while the used node's stays flat. Packing leaves more
// nodes unused, and Filter tries them for every pod.
func BenchmarkAllocatorUnusedDevice(b *testing.B) {
	for _, shares := range []int{0, 1000, 5000} {
		dra := &fixture.DRA{Classes: fixture.Classes()}
		const n = 100
		for i := range n {
			dra.Slices = append(dra.Slices, fixture.Server(fmt.Sprintf("node-%04d", i), "100T", "80Ti"))
		}
		// node-0000 stays unused; the shares go round the others.
		for s := range shares {
			node := fmt.Sprintf("node-%04d", 1+s%(n-1))
			c := fixture.Claim("held", fmt.Sprintf("s%d", s), fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: "1M"}))
			dev := "nic-0000-19-00-0"
			if s%2 == 1 {
				c = fixture.Claim("held", fmt.Sprintf("s%d", s), fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "1Gi"}))
				dev = "gpu-0000-18-00-0"
			}
			fixture.Allocate(c, node, dev)
			dra.Claims = append(dra.Claims, c)
		}
		pending := []*resourceapi.ResourceClaim{
			fixture.Claim("default", "g", fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "8Gi"})),
			fixture.Claim("default", "n", fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: "10G"})),
		}
		state, _ := dra.ResourceClaims().GatherAllocatedState()
		cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
		features := structured.Features{ConsumableCapacity: true, PartitionableDevices: true, PrioritizedList: true}
		ctx := context.Background()
		alloc, err := structured.NewAllocator(ctx, features, *state, dra.DeviceClasses(), dra.Slices, cache)
		if err != nil {
			b.Fatal(err)
		}
		for _, node := range []string{"node-0000", "node-0001"} {
			use := "unused"
			if node != "node-0000" {
				use = "used"
			}
			if shares == 0 && use == "used" {
				continue // no node holds shares
			}
			b.Run(fmt.Sprintf("shares=%d/node=%s", shares, use), func(b *testing.B) {
				for range b.N {
					res, err := alloc.Allocate(ctx, fixture.Node(node), pending)
					if err != nil || len(res) != 2 {
						b.Fatalf("allocate on %s: %v, %d results", node, err, len(res))
					}
				}
			})
		}
	}
}

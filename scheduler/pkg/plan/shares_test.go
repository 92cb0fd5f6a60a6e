package plan

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
)

// A NIC's "shares" capacity as carve publishes it: every allocation
// consumes 1, asked or not, and the stock allocator sums them, so a NIC of
// 2 shares takes no third claim however little bandwidth it asks for, and
// a claim asking for 2 shares fits no NIC.
func TestSharesCapacityIsSummed(t *testing.T) {
	d := fixture.NIC("nic-0000-19-00-0", "pci0000:17", 0, "100G")
	d.Capacity[fixture.Shares] = resourceapi.DeviceCapacity{Value: resource.MustParse("2"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default:    ptr.To(resource.MustParse("1")),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1")), Max: ptr.To(resource.MustParse("1"))},
	}}
	greedy := fixture.Claim("default", "greedy", fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: "1M", fixture.Shares: "2"}))
	in := Input{Slices: []*resourceapi.ResourceSlice{fixture.Slice("n1", d)},
		Claims: []*resourceapi.ResourceClaim{greedy, nic("a", "1M"), nic("b", "1M"), nic("c", "1M")}}
	res, err := Run(context.Background(), in, sharefit.MostAllocated)
	if err != nil {
		t.Fatal(err)
	}
	p := res.Placements
	if len(p) != 4 {
		t.Fatalf("placements %+v", p)
	}
	if p[0].Node != "" || p[0].Reason == "" {
		t.Errorf("a claim asking for 2 shares placed: %+v", p[0])
	}
	for _, i := range []int{1, 2} {
		if p[i].Node != "n1" || len(p[i].Devices) != 1 {
			t.Fatalf("claim %s not placed: %+v", p[i].Claim, p[i])
		}
		if q := p[i].Devices[0].ConsumedCapacity[fixture.Shares]; q.Value() != 1 {
			t.Errorf("claim %s consumes %s shares, want 1", p[i].Claim, q.String())
		}
	}
	if p[3].Node != "" || p[3].Reason == "" {
		t.Errorf("a third share of a NIC of 2 placed: %+v", p[3])
	}
	t.Logf("the third claim: %s", p[3].Reason)
}

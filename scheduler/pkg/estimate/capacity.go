package estimate

import (
	resourceapi "k8s.io/api/resource/v1"
)

// consume returns how much of capacity a request for requested (nil: the
// request does not name this capacity) consumes, with the device's request
// policy applied the way the allocator applies it (integer arithmetic), and
// whether the policy admits the request at all.
func consume(requested *int64, capacity resourceapi.DeviceCapacity) (int64, bool) {
	policy := capacity.RequestPolicy
	if requested == nil {
		if policy != nil && policy.Default != nil {
			return policy.Default.Value(), true
		}
		return capacity.Value.Value(), true
	}
	want := *requested
	if policy == nil {
		return want, true
	}
	if policy.Default != nil && want == policy.Default.Value() {
		return want, true
	}
	switch {
	case policy.ValidRange != nil && policy.ValidRange.Min != nil:
		r := policy.ValidRange
		minimum := r.Min.Value()
		if want < minimum {
			want = minimum
		} else if r.Step != nil && r.Step.Value() > 0 {
			step := r.Step.Value()
			n := (want - minimum + step - 1) / step
			want = minimum + n*step
		}
		if r.Max != nil && want > r.Max.Value() {
			return 0, false
		}
		return want, true
	case len(policy.ValidValues) > 0:
		for _, v := range policy.ValidValues {
			if want <= v.Value() {
				return v.Value(), true
			}
		}
		return 0, false
	}
	return want, true
}

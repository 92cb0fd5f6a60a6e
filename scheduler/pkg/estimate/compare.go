package estimate

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// Miss is a request whose predicted devices differ from the ones the
// allocator gave it.
type Miss struct {
	Claim, Request    string
	Predicted, Actual []string
}

// Compare lists where picks (from Picks on the node the pod went to) differ
// from the allocation of claim, the pending claim that the picks' ClaimName
// names. It tells how often the estimate, and so the scores, were wrong.
func Compare(picks []Pick, claim *resourceapi.ResourceClaim, alloc *resourceapi.AllocationResult, driver string) []Miss {
	name := claim.Namespace + "/" + claim.Name
	predicted := map[string][]string{}
	for _, p := range picks {
		if p.Request.ClaimName == name {
			predicted[p.Request.Name] = append(predicted[p.Request.Name], p.Device.ID.Device.String())
		}
	}
	actual := map[string][]string{}
	if alloc != nil {
		for _, r := range alloc.Devices.Results {
			if _, ok := predicted[r.Request]; ok && r.Driver == driver {
				actual[r.Request] = append(actual[r.Request], r.Device)
			}
		}
	}
	var out []Miss
	for req, want := range predicted {
		got := actual[req]
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			out = append(out, Miss{Claim: name, Request: req, Predicted: want, Actual: got})
		}
	}
	return out
}

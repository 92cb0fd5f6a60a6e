package main

import (
	"context"
	"fmt"
	"math"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/slices/names"
)

// placement measures where the run's claims landed: the devices in use; the
// fewest devices that could hold the same shares (per kind, the largest of
// total consumed over one device's capacity, per capacity, rounded up); and,
// of the pods with a GPU and a NIC share, how many got both under one PCIe
// root.
func placement(ctx context.Context, c kubernetes.Interface, ns string, infos map[string]deviceInfo) (used, minimum, pairs, aligned int, err error) {
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("list claims: %w", err)
	}
	inUse := map[string]bool{}
	consumed := map[string]map[string]float64{} // kind -> capacity -> total
	capOf := map[string]map[string]float64{}    // kind -> capacity -> one device's
	roots := map[string]map[string]string{}     // pod -> kind -> root
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		owner := ""
		for _, o := range cl.OwnerReferences {
			if o.Kind == "Pod" {
				owner = o.Name
			}
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			key := r.Pool + "/" + r.Device
			info, ok := infos[key]
			if !ok {
				continue
			}
			inUse[key] = true
			if consumed[info.kind] == nil {
				consumed[info.kind], capOf[info.kind] = map[string]float64{}, map[string]float64{}
			}
			for n, q := range r.ConsumedCapacity {
				total := info.capacity[n].Value
				consumed[info.kind][string(n)] += q.AsApproximateFloat64()
				capOf[info.kind][string(n)] = total.AsApproximateFloat64()
			}
			if owner != "" {
				if roots[owner] == nil {
					roots[owner] = map[string]string{}
				}
				roots[owner][info.kind] = info.root
			}
		}
	}
	for kind, caps := range consumed {
		most := 0
		for n, total := range caps {
			if per := capOf[kind][n]; per > 0 {
				most = max(most, int(math.Ceil(total/per-1e-9)))
			}
		}
		minimum += most
	}
	for _, r := range roots {
		g, okG := r[names.KindGPU]
		n, okN := r[names.KindNIC]
		if okG && okN {
			pairs++
			if g != "" && g == n {
				aligned++
			}
		}
	}
	return len(inUse), minimum, pairs, aligned, nil
}

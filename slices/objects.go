package slices

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// Objects renders the pools as the ResourceSlice objects the kubelet plugin
// helper publishes for them. The helper names slices with a random suffix;
// here the name is "<node>-<driver>-<index>", so that output can be compared
// and applied as it is.
func Objects(driverName, nodeName string, res resourceslice.DriverResources) []resourceapi.ResourceSlice {
	var out []resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			out = append(out, resourceapi.ResourceSlice{
				TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nodeName, driverName, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver: driverName,
					Pool: resourceapi.ResourcePool{
						Name:               poolName,
						Generation:         pool.Generation,
						ResourceSliceCount: int64(len(pool.Slices)),
					},
					NodeName:               ptr.To(nodeName),
					Devices:                s.Devices,
					SharedCounters:         s.SharedCounters,
					PerDeviceNodeSelection: s.PerDeviceNodeSelection,
				},
			})
		}
	}
	return out
}

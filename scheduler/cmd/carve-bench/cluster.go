package main

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
	"github.com/carve-dra/carve/slices/names"
)

// nodeLabel marks the benchmark's Node objects.
const nodeLabel = "bench.carve.dev/node"

// Device sizes of the benchmark's servers.
const (
	nicBandwidth = "100G"
	gpuMemory    = "80Gi"
)

// ensureClasses creates carve's NIC and GPU device classes where missing.
func ensureClasses(ctx context.Context, c kubernetes.Interface) error {
	for _, dc := range fixture.Classes() {
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create device class %s: %w", dc.Name, err)
		}
	}
	return nil
}

// createNodes makes n kubelet-less Ready nodes, each with a carve pool of
// two GPUs and two NICs (fixture.Server), in parallel.
func createNodes(ctx context.Context, c kubernetes.Interface, n int) error {
	klog.FromContext(ctx).Info("Creating nodes", "count", n)
	return parallel(ctx, n, 16, func(i int) error {
		name := fmt.Sprintf("bench-node-%04d", i)
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{nodeLabel: "true", "kubernetes.io/hostname": name}}}
		node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
		res := v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("256"),
			v1.ResourceMemory: resource.MustParse("2Ti"),
			v1.ResourcePods:   resource.MustParse("1000"),
		}
		status, err := json.Marshal(map[string]v1.NodeStatus{"status": {
			Capacity: res, Allocatable: res,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "Bench", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}})
		if err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		// A patch, since controllers annotate new nodes at once.
		if _, err := c.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		slice := fixture.Server(name, nicBandwidth, gpuMemory)
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create slice of %s: %w", name, err)
		}
		return nil
	})
}

// deleteNodes removes the benchmark's nodes and their slices.
func deleteNodes(ctx context.Context, c kubernetes.Interface) error {
	if err := c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.driver=" + fixture.Driver}); err != nil {
		return fmt.Errorf("delete slices: %w", err)
	}
	if err := c.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: nodeLabel}); err != nil {
		return fmt.Errorf("delete nodes: %w", err)
	}
	return nil
}

// slicesByDevice maps "pool/device" to the device's PCIe root and kind.
func devicesInfo(ctx context.Context, c kubernetes.Interface) (map[string]deviceInfo, error) {
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + fixture.Driver})
	if err != nil {
		return nil, fmt.Errorf("list slices: %w", err)
	}
	out := map[string]deviceInfo{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			out[s.Spec.Pool.Name+"/"+d.Name] = deviceInfo{
				kind:     str(d.Attributes[names.AttrKind]),
				root:     str(d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]),
				capacity: d.Capacity,
			}
		}
	}
	return out, nil
}

type deviceInfo struct {
	kind, root string
	capacity   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

func str(a resourceapi.DeviceAttribute) string {
	if a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// noopDriverName is the do-nothing driver's name on the real node, beside
// carve's own.
const noopDriverName = "noop.carve.dev"

// noopShareTemplate is the claim template of a share of the do-nothing
// driver's shared device, runNoopNodeDriver's where it is given one.
const noopShareTemplate = "noop-share"

// noopShared is the name of the do-nothing driver's shared device, and
// noopSharedAttr the attribute that tells it from the others (true) for
// the two templates' selectors.
const (
	noopShared     = "share"
	noopSharedAttr = "noopShared"
)

// runNoopNodeDriver starts the do-nothing driver (noopDriver, the floor of
// the prepare benchmarks) on the real node, registered with its kubelet,
// with a ResourceSlice of devices plain devices, a DeviceClass and a claim
// template, both named noopDriverName, in testNS: pods with a claim from
// that template pay all that DRA costs outside carve (the scheduler's
// allocation, the ResourceClaim objects, the kubelet's DRA manager and its
// gRPC calls) and nothing of carve's. It is the reference of
// TestNodeManySharePods and BenchmarkPodStart (issue 44, items 3 and 4).
//
// Where shared is not nil the driver also publishes a copy of it (its
// attributes, capacity and allowMultipleAllocations) named noopShared, and
// the claim template noopShareTemplate asks each claim for share's
// capacity of it: the scheduler then allocates the same consumable
// capacity of one device as for carve's share pods, whose cost grows with
// the shares already allocated, and only the node's part differs.
// Everything goes when t ends.
func runNoopNodeDriver(t testing.TB, cs kubernetes.Interface, env map[string]string, devices int, shared *resourceapi.Device, share map[resourceapi.QualifiedName]resource.Quantity) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	node := env["CARVE_NODE_NAME"]
	pluginDir := filepath.Join(env["KUBELET_ROOT_DIR"], "plugins", noopDriverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		cancel()
		t.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, noopDriver{}, kubeletplugin.DriverName(noopDriverName), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(cs), kubeletplugin.RegistrarDirectoryPath(filepath.Join(env["KUBELET_ROOT_DIR"], "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(pluginDir), kubeletplugin.Serialize(false))
	if err != nil {
		cancel()
		t.Fatalf("start the do-nothing driver: %v", err)
	}
	t.Cleanup(func() {
		helper.Stop()
		cancel()
		_ = os.RemoveAll(pluginDir)
		_ = cs.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + noopDriverName})
	})
	// A slice holds at most ResourceSliceMaxDevices (128): 250 pods'
	// devices take two.
	var slices []resourceslice.Slice
	for i := range devices {
		if i%resourceapi.ResourceSliceMaxDevices == 0 {
			slices = append(slices, resourceslice.Slice{})
		}
		last := &slices[len(slices)-1]
		last.Devices = append(last.Devices, resourceapi.Device{Name: fmt.Sprintf("noop-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{noopSharedAttr: {BoolValue: ptr.To(false)}}})
	}
	published := devices
	if shared != nil {
		published++
		// Its attributes, capacity and allowMultipleAllocations: what the
		// allocator weighs. Not its counters (carve's counter sets are
		// not in this pool), node fields or taints.
		d := resourceapi.Device{Name: noopShared, Attributes: shared.DeepCopy().Attributes, Capacity: shared.DeepCopy().Capacity,
			AllowMultipleAllocations: shared.AllowMultipleAllocations}
		if d.Attributes == nil {
			d.Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		}
		d.Attributes[noopSharedAttr] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
		slices = append(slices, resourceslice.Slice{Devices: []resourceapi.Device{d}})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: slices},
	}}); err != nil {
		t.Fatalf("publish the do-nothing driver's devices: %v", err)
	}
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: noopDriverName}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + noopDriverName + `"`}}}}}
	_ = cs.ResourceV1().DeviceClasses().Delete(ctx, dc.Name, metav1.DeleteOptions{})
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{})
	})
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: noopDriverName, Namespace: testNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "noop", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: noopDriverName,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `!device.attributes["` + noopDriverName + `"].` + noopSharedAttr}}}}}}}}}}
	_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(ctx, tmpl.Name, metav1.DeleteOptions{})
	if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), tmpl.Name, metav1.DeleteOptions{})
	})
	if shared != nil {
		st := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: noopShareTemplate, Namespace: testNS},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "net", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: noopDriverName,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["` + noopDriverName + `"].` + noopSharedAttr}}},
					Capacity:  &resourceapi.CapacityRequirements{Requests: share}}}}}}}}
		_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(ctx, st.Name, metav1.DeleteOptions{})
		if _, err := cs.ResourceV1().ResourceClaimTemplates(testNS).Create(ctx, st, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.ResourceV1().ResourceClaimTemplates(testNS).Delete(context.Background(), st.Name, metav1.DeleteOptions{})
		})
	}
	waitFor(t, "the do-nothing driver's devices published", time.Minute, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + noopDriverName})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range l.Items {
			n += len(s.Spec.Devices)
		}
		return n == published, fmt.Errorf("%d of %d devices published", n, published)
	})
}

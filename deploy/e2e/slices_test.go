package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// applySlices creates the slices carve builds for a root, reads each back and
// checks the server kept every field: a field the server drops (for example
// allowMultipleAllocations with consumable capacity off) is a failure too.
func applySlices(t testing.TB, cs kubernetes.Interface, root, node string, cfg *nodeconfig.NodeConfig) []resourceapi.ResourceSlice {
	t.Helper()
	ctx := context.Background()
	inv, err := discovery.Discover(ctx, discovery.Options{Root: root, Net: discovery.NetFilter{
		Include: cfg.Netdev.Include, Exclude: cfg.Netdev.Exclude, IncludeVirtual: cfg.Netdev.IncludeVirtual,
	}})
	if err != nil {
		t.Fatalf("discover %s: %v", root, err)
	}
	objs := slices.Objects(cfg.DriverName, node, slices.Build(inv, cfg, node).Resources)
	for i := range objs {
		created, err := cs.ResourceV1().ResourceSlices().Create(ctx, &objs[i], metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("API server rejected slice %s: %v", objs[i].Name, err)
		}
		name := created.Name
		t.Cleanup(func() {
			_ = cs.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		if !apiequality.Semantic.DeepEqual(created.Spec.Devices, objs[i].Spec.Devices) {
			t.Errorf("slice %s: the server changed the devices (a dropped field means a feature gate is off)\nsent: %+v\ngot:  %+v",
				name, objs[i].Spec.Devices, created.Spec.Devices)
		}
	}
	return objs
}

func TestAPIServerAcceptsThisHostsSlices(t *testing.T) {
	cs := client(t)
	objs := applySlices(t, cs, "/", "e2e-this-host", nodeconfig.Default())
	n := 0
	for _, o := range objs {
		n += len(o.Spec.Devices)
	}
	t.Logf("this host: %d slice(s), %d device(s) accepted", len(objs), n)
}

func TestAPIServerAcceptsFixtureSlices(t *testing.T) {
	cs := client(t)
	cfg, err := nodeconfig.Decode([]byte(`
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  includeVirtual: true
  bandwidth:
  - interface: "*"
    egress: 10G
requestPolicies:
  nic:
    egressBandwidth: {default: 100M, min: 10M, step: 10M, max: 5G}
    ingressBandwidth: {default: 50M}
  llc:
    ways: {default: 2, min: 1, step: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tree func(string) *sysfstest.Tree
		cfg  *nodeconfig.NodeConfig
	}{
		{"typical", sysfstest.Typical, nodeconfig.Default()},
		{"typical-configured", sysfstest.Typical, cfg},
		{"large", sysfstest.Large, nodeconfig.Default()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := tc.tree(t.TempDir())
			objs := applySlices(t, cs, tree.Root, "e2e-"+tc.name, tc.cfg)
			shareable := 0
			for _, o := range objs {
				for _, d := range o.Spec.Devices {
					if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
						shareable++
					}
				}
			}
			if shareable == 0 {
				t.Errorf("no shareable device was sent: the fixture should have some")
			}
			t.Logf("%d slice(s) accepted, %d shareable device(s)", len(objs), shareable)
		})
	}
}

// The server really judges: a slice that breaks the API's rules is refused.
// Without this, the acceptance tests above could pass against anything.
func TestAPIServerRejectsInvalidSlice(t *testing.T) {
	cs := client(t)
	tree := sysfstest.Typical(t.TempDir())
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	objs := slices.Objects("carve.dev", "e2e-invalid", slices.Build(inv, nodeconfig.Default(), "e2e-invalid").Resources)
	for _, tc := range []struct {
		name    string
		corrupt func(*resourceapi.ResourceSlice)
	}{
		{"device name not a DNS label", func(s *resourceapi.ResourceSlice) { s.Spec.Devices[0].Name = "NIC_0000:17:00.0" }},
		{"too many devices", func(s *resourceapi.ResourceSlice) {
			for i := len(s.Spec.Devices); i <= resourceapi.ResourceSliceMaxDevices; i++ {
				d := s.Spec.Devices[0].DeepCopy()
				d.Name = fmt.Sprintf("extra-%d", i)
				s.Spec.Devices = append(s.Spec.Devices, *d)
			}
		}},
		{"attribute value too long", func(s *resourceapi.ResourceSlice) {
			v := strings.Repeat("x", resourceapi.DeviceAttributeMaxValueLength+1)
			s.Spec.Devices[0].Attributes["kind"] = resourceapi.DeviceAttribute{StringValue: &v}
		}},
	} {
		s := objs[0].DeepCopy()
		tc.corrupt(s)
		_, err := cs.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsInvalid(err) {
			t.Errorf("%s: server answered %v, want Invalid", tc.name, err)
		}
	}
}

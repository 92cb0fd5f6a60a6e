package e2e

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-dra/carve/cmd/carve/app"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// Every taint carve makes, each reason with each effect a node config can
// give it, on the slices of a typical node and on a ghost (a device gone,
// published still), passes the real API server's validation unchanged.
func TestAPIServerAcceptsHealthTaints(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	tree := sysfstest.Typical(t.TempDir())
	inv, err := discovery.Discover(ctx, discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	const node = "e2e-health-taints"
	res := slices.Build(inv, nodeconfig.Default(), node)
	reasons := []struct {
		sev    health.Severity
		reason string
	}{{health.Degraded, netdev.ReasonLinkDown}, {health.Degraded, netdev.ReasonErrorRate}, {health.Lost, netdev.ReasonDeviceGone},
		{health.Lost, netdev.ReasonPCIFunctionGone}, {health.Lost, netdev.ReasonDriverUnbound}, {health.Degraded, "XID79"}, {health.Lost, "GPULost"}}
	effects := []string{nodeconfig.EffectNoSchedule, nodeconfig.EffectNoExecute, nodeconfig.EffectNone}
	taints := map[string][]resourceapi.DeviceTaint{}
	i := 0
	var ghost resourceapi.Device
	for name, e := range res.Index {
		r := reasons[i%len(reasons)]
		cfg := nodeconfig.Health{Reasons: map[string]string{r.reason: effects[i%len(effects)]}}
		taints[name] = []resourceapi.DeviceTaint{app.Taint("carve.dev", cfg, health.Status{Device: name, Tainted: true, Severity: r.sev, Reason: r.reason, Since: time.Now()})}
		if i == 0 {
			ghost = e.Device
			ghost.Name += "-gone"
			taints[ghost.Name] = []resourceapi.DeviceTaint{app.Taint("carve.dev", nodeconfig.Health{}, health.Status{Tainted: true, Severity: health.Lost, Reason: netdev.ReasonDeviceGone, Since: time.Now()})}
		}
		i++
	}
	objs := slices.Objects("carve.dev", node, slices.WithTaints(res.Resources, taints, []resourceapi.Device{ghost}))
	seen := 0
	for i := range objs {
		created, err := cs.ResourceV1().ResourceSlices().Create(ctx, &objs[i], metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("API server rejected slice %s: %v", objs[i].Name, err)
		}
		name := created.Name
		t.Cleanup(func() {
			_ = cs.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		for j, d := range created.Spec.Devices {
			if len(d.Taints) > 0 {
				seen++
			}
			if !apiequality.Semantic.DeepEqual(d.Taints, objs[i].Spec.Devices[j].Taints) {
				t.Errorf("device %s: sent taints %+v, the server kept %+v", d.Name, objs[i].Spec.Devices[j].Taints, d.Taints)
			}
		}
	}
	if seen != len(taints) {
		t.Errorf("%d tainted devices stored, want %d", seen, len(taints))
	}
	t.Logf("%d tainted devices in %d slices accepted", seen, len(objs))
}

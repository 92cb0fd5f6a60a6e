package app_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// LLC shares through the driver: the CDI library reads back specs that set
// linux.intelRdt, and a share beyond the cache's ways is refused before
// anything is applied.
func TestLLCSharesThroughDriver(t *testing.T) {
	e := newEnv(t, nil)
	ways := func(n string) map[resourceapi.QualifiedName]resource.Quantity {
		return map[resourceapi.QualifiedName]resource.Quantity{"ways": resource.MustParse(n)}
	}
	a := claim("la", "la", []result{{request: "cache", device: "llc-0", share: "sa", consumed: ways("4")}})
	b := claim("lb", "lb", []result{{request: "cache", device: "llc-0", share: "sb", consumed: ways("4")}})
	over := claim("lc", "lc", []result{{request: "cache", device: "llc-0", share: "sc", consumed: ways("8")}})
	res := e.prepare(a, b, over)
	if res["la"].Err != nil || res["lb"].Err != nil {
		t.Fatalf("la, lb = %v, %v", res["la"].Err, res["lb"].Err)
	}
	if err := res["lc"].Err; err == nil || !strings.Contains(err.Error(), "exceeds its capacity") {
		t.Errorf("lc = %v, want over capacity (15 ways, 8 in use)", err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	closIDs := map[string]string{}
	for _, uid := range []string{"la", "lb"} {
		dev := cache.GetDevice(res[types.UID(uid)].Devices[0].CDIDeviceIDs[0])
		if dev == nil {
			t.Fatalf("CDI device of %s not found: %v", uid, cache.GetErrors())
		}
		rdt := dev.ContainerEdits.IntelRdt
		if rdt == nil || !strings.HasPrefix(rdt.ClosID, "carve-") || !strings.HasPrefix(rdt.L3CacheSchema, "L3:0=") {
			t.Fatalf("%s intelRdt = %+v", uid, rdt)
		}
		closIDs[rdt.ClosID] = rdt.L3CacheSchema
	}
	if len(closIDs) != 2 {
		t.Errorf("closIDs %v, want one group per share", closIDs)
	}
	e.unprepare("la", "lb")
}

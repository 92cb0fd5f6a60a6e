package prepare

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/slices/names"
)

const fuzzDriver = "carve.dev"

// FuzzEffectiveConfig runs a DeviceClass's and a claim's opaque configs
// through the path the driver takes at prepare (effectiveConfig, then
// DecodeEffectiveConfig where the preparer reads the result back from the
// allocation). The class's config is the admin's; the claim's is any
// tenant's, and must never reach what the admin alone sets.
//
// sel picks the shape of the allocation: bit 0 a NIC (else a GPU), bit 1
// the class config for another request, bit 2 the claim config for the
// request's parent ("r" for "r/sub"), bit 3 another driver's config
// carrying the claim's bytes in between (never read), bit 4 a second
// claim config after the first, carrying the class's bytes.
func FuzzEffectiveConfig(f *testing.F) {
	net := func(s string) []byte {
		return []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig"` + s + `}`)
	}
	dev := []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"A":"1"}}`)
	class := net(`,"mode":"ipvlan","vlan":7,"addresses":["10.0.0.5/24"],"routes":[{"destination":"default","gateway":"10.0.0.1"}],"mtu":1500`)
	for _, tc := range []struct {
		class, claim []byte
		sel          uint8
	}{
		{class, net(`,"interfaceName":"data0","mtu":9000,"pools":["a","b"]`), 1},
		{class, net(`,"pools":["a"]`), 1 | 4},
		{class, dev, 1 | 8},
		{dev, net(`,"mode":"macvlan"`), 1},         // forbidden to a claim
		{class, net(`,"vlan":0`), 1},               // forbidden, even a zero
		{class, net(`,"routes":null`), 1},          // forbidden, even a null
		{class, net(`,"mtu":1,"mtu":9000`), 1},     // duplicate field
		{class, net(`,"\u0076lan":9`), 1},          // an escaped forbidden name
		{class, net(`,"Vlan":9`), 1},               // a forbidden name in another case
		{class, net(`,"interfaceName":"eth0"`), 1}, // reserved
		{class, net(`,"pools":["a"]`), 0},          // a NetworkConfig for a GPU
		{net(`,"pools":["a"],"allowedPools":["b"]`), net(`,"pools":["b"]`), 1},
		{net(`,"allowedPools":["b"]`), net(`,"pools":["a"]`), 1},              // not the class's
		{net(`,"allowedPools":["b"]`), net(`,"allowedPools":["a"]`), 1},       // the class's to set
		{net(`,"openFamilies":["IPv6"]`), net(`,"openFamilies":["IPv4"]`), 1}, // the class's to set
		{dev, []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"CARVE_CLAIM_UID":"x"}}`), 0},
		{dev, []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"carve_x":"\n\u0000"}}`), 16},
		{[]byte(`{}`), []byte(`[]`), 1},
		{nil, nil, 2},
		{class, []byte(strings.Repeat(`{"a":`, 3000) + `1` + strings.Repeat(`}`, 3000)), 1},
	} {
		f.Add(tc.class, tc.claim, tc.sel)
	}
	f.Fuzz(func(t *testing.T, classRaw, claimRaw []byte, sel uint8) {
		kind := names.KindGPU
		if sel&1 != 0 {
			kind = names.KindNIC
		}
		request := "r/sub"
		classReqs, claimReqs := []string{"r/sub"}, []string{"r/sub"}
		if sel&2 != 0 {
			classReqs = []string{"other"}
		}
		if sel&4 != 0 {
			claimReqs = []string{"r"}
		}
		opaque := func(driver string, raw []byte) *resourceapi.OpaqueDeviceConfiguration {
			return &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: raw}}
		}
		configs := []resourceapi.DeviceAllocationConfiguration{
			{Source: resourceapi.AllocationConfigSourceClass, Requests: classReqs,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque(fuzzDriver, classRaw)}},
		}
		if sel&8 != 0 {
			configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque("other.example.com", claimRaw)}})
		}
		configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim, Requests: claimReqs,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque(fuzzDriver, claimRaw)}})
		if sel&16 != 0 {
			configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: opaque(fuzzDriver, classRaw)}})
		}
		classApplies := sel&2 == 0

		raw, err := effectiveConfig(fuzzDriver, configs, request, kind)
		if err != nil {
			// Every refusal says whose config it is, and names the
			// config entry and the field.
			msg := err.Error()
			if !strings.HasPrefix(msg, "config from class: ") && !strings.HasPrefix(msg, "config from claim: ") {
				t.Fatalf("the error does not say whose config: %v", err)
			}
			if !strings.Contains(msg, "status.allocation.devices.config[") || !strings.Contains(msg, "opaque.parameters") {
				t.Fatalf("the error does not name the config entry: %v", err)
			}
			return
		}
		// Each config that applied was accepted on its own: decoding it
		// again with the same checks succeeds.
		var class, claim EffectiveConfig
		if classApplies {
			if err := decodeConfig(classRaw, kind, field.NewPath("class"), &class); err != nil {
				t.Fatalf("accepted a class config that does not decode alone: %v", err)
			}
		}
		if err := decodeConfig(claimRaw, kind, field.NewPath("claim"), &claim); err != nil {
			t.Fatalf("accepted a claim config that does not decode alone: %v", err)
		}

		eff, err := DecodeEffectiveConfig(raw)
		if err != nil {
			t.Fatalf("the effective config %s does not decode: %v", raw, err)
		}
		if raw == nil {
			if eff.Device != nil || eff.Network != nil {
				t.Fatalf("no config, yet %+v", eff)
			}
			return
		}
		again, err := json.Marshal(eff)
		if err != nil || !bytes.Equal(again, raw) {
			t.Fatalf("the effective config does not round trip:\n%s\n%s (%v)", raw, again, err)
		}
		if eff.Device != nil {
			if errs := v1alpha1.ValidateDeviceConfig(eff.Device, field.NewPath("eff")); len(errs) > 0 {
				t.Fatalf("effective DeviceConfig fails validation: %v", errs)
			}
			env := eff.DeviceEnv()
			if !sort.StringsAreSorted(env) || len(env) != len(eff.Device.Env) {
				t.Fatalf("DeviceEnv = %q for %v", env, eff.Device.Env)
			}
			for _, e := range env {
				if name, _, _ := strings.Cut(e, "="); strings.HasPrefix(strings.ToUpper(name), "CARVE_") || name == "" {
					t.Fatalf("a config sets %q in the container", e)
				}
			}
		}
		n := eff.Network
		if n == nil {
			return
		}
		if kind != names.KindNIC {
			t.Fatalf("a NetworkConfig applied to a %s", kind)
		}
		if errs := v1alpha1.ValidateNetworkConfig(n, field.NewPath("eff")); len(errs) > 0 {
			t.Fatalf("effective NetworkConfig fails validation: %v", errs)
		}
		if claim.Network == nil || sel&16 != 0 {
			return // (a second claim config, the class's bytes, wins)
		}
		// The pools a claim named are among those its class names (in
		// pools or allowedPools); a class that names none allows none.
		if _, named := jsonFields(claimRaw)["pools"]; named {
			var allowed []string
			if classApplies && class.Network != nil {
				allowed = append(append(allowed, class.Network.Pools...), class.Network.AllowedPools...)
			}
			for _, p := range n.Pools {
				if !slices.Contains(allowed, p) {
					t.Fatalf("the claim %q took pool %q, which its class %q does not name", claimRaw, p, classRaw)
				}
			}
		}
		// The claim set at most interfaceName, mtu and pools: everything
		// else is the class's or, with no class NetworkConfig, the
		// defaults.
		want := class.Network
		if want == nil {
			want = &v1alpha1.NetworkConfig{}
			v1alpha1.SetDefaultsNetworkConfig(want)
		}
		// (An empty list and none are the same setting: JSON omits both.)
		if !sameList(n.Addresses, want.Addresses) || !sameList(n.Routes, want.Routes) ||
			n.Mode != want.Mode || n.MacvlanMode != want.MacvlanMode || n.IPVlanMode != want.IPVlanMode || n.VLAN != want.VLAN {
			t.Fatalf("the claim %q changed what the class %q sets:\nclass %+v\neffective %+v", claimRaw, classRaw, want, n)
		}
	})
}

// FuzzDecodeEffectiveConfig reads an allocation's effective config as the
// preparers do, from the checkpoint (where a torn or edited file may put
// anything): what decodes encodes and decodes to the same.
func FuzzDecodeEffectiveConfig(f *testing.F) {
	for _, s := range []string{
		`{"device":{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"B":"2","A":"1"}}}`,
		`{"network":{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mode":"macvlan","macvlanMode":"vepa","interfaceName":"net1","pools":["p"]}}`,
		`{"device":null,"network":{"mtu":-1,"vlan":99999999999,"routes":[{}]},"extra":1}`,
		`null`, ``, `{"device":{"env":{"A":"1","A":"2"}}}`, `{"network":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		eff, err := DecodeEffectiveConfig(raw)
		if err != nil {
			return
		}
		env := eff.DeviceEnv()
		if !sort.StringsAreSorted(env) {
			t.Fatalf("DeviceEnv not sorted: %q", env)
		}
		out, err := json.Marshal(eff)
		if err != nil {
			t.Fatalf("encode %+v: %v", eff, err)
		}
		again, err := DecodeEffectiveConfig(out)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", out, err)
		}
		if out2, _ := json.Marshal(again); !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the config:\n%s\n%s", out, out2)
		}
	})
}

// A refused config says whose it is: the class's (the admin's) or the
// claim's. (Found by FuzzEffectiveConfig's seeds: it said "fromclaim".)
func TestConfigErrorSaysWhose(t *testing.T) {
	bad := []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtu":1}`)
	for source, want := range map[resourceapi.AllocationConfigSource]string{
		resourceapi.AllocationConfigSourceClass: "config from class: ",
		resourceapi.AllocationConfigSourceClaim: "config from claim: ",
	} {
		configs := []resourceapi.DeviceAllocationConfiguration{{Source: source, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: fuzzDriver, Parameters: runtime.RawExtension{Raw: bad}}}}}
		_, err := effectiveConfig(fuzzDriver, configs, "r", names.KindNIC)
		if err == nil || !strings.HasPrefix(err.Error(), want+"status.allocation.devices.config[0].opaque.parameters.mtu") {
			t.Errorf("%s: %v; want %q and the field", source, err, want)
		}
	}
}

// jsonFields is the top-level fields of a JSON object, or none.
func jsonFields(raw []byte) map[string]json.RawMessage {
	fields := map[string]json.RawMessage{}
	_ = json.Unmarshal(raw, &fields)
	return fields
}

// A GPUConfig applies to GPUs only; a claim's sizes its own /dev/shm over
// its class's.
func TestGPUConfig(t *testing.T) {
	cfg := func(source resourceapi.AllocationConfigSource, size string) resourceapi.DeviceAllocationConfiguration {
		raw := []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"` + size + `"}`)
		return resourceapi.DeviceAllocationConfiguration{Source: source, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: fuzzDriver, Parameters: runtime.RawExtension{Raw: raw}}}}
	}
	configs := []resourceapi.DeviceAllocationConfiguration{cfg(resourceapi.AllocationConfigSourceClass, "2Gi"), cfg(resourceapi.AllocationConfigSourceClaim, "4Gi")}
	raw, err := effectiveConfig(fuzzDriver, configs, "r", names.KindGPU)
	if err != nil {
		t.Fatal(err)
	}
	var eff EffectiveConfig
	if err := json.Unmarshal(raw, &eff); err != nil || eff.GPU == nil || eff.GPU.SharedMemorySize.Value() != 4<<30 {
		t.Errorf("effective %s: %v", raw, err)
	}
	if _, err := effectiveConfig(fuzzDriver, configs[:1], "r", names.KindNIC); err == nil || !strings.Contains(err.Error(), "applies to gpu devices, not to a nic device") {
		t.Errorf("a GPUConfig on a NIC: %v", err)
	}
	// The class's bound reaches the agent with the claim's size; a
	// claim may not set the bound itself.
	bounded := func(source resourceapi.AllocationConfigSource, field, size string) resourceapi.DeviceAllocationConfiguration {
		c := cfg(source, "1Gi")
		c.Opaque.Parameters.Raw = []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","` + field + `":"` + size + `"}`)
		return c
	}
	raw, err = effectiveConfig(fuzzDriver, []resourceapi.DeviceAllocationConfiguration{bounded(resourceapi.AllocationConfigSourceClass, "maxSharedMemorySize", "8Gi"), cfg(resourceapi.AllocationConfigSourceClaim, "4Gi")}, "r", names.KindGPU)
	eff = EffectiveConfig{}
	if err != nil || json.Unmarshal(raw, &eff) != nil || eff.GPU.SharedMemorySize.Value() != 4<<30 || eff.GPU.MaxSharedMemorySize == nil || eff.GPU.MaxSharedMemorySize.Value() != 8<<30 {
		t.Errorf("the class's bound with the claim's size: %s, %v", raw, err)
	}
	_, err = effectiveConfig(fuzzDriver, []resourceapi.DeviceAllocationConfiguration{bounded(resourceapi.AllocationConfigSourceClaim, "maxSharedMemorySize", "1Ti")}, "r", names.KindGPU)
	if err == nil || !strings.Contains(err.Error(), "maxSharedMemorySize: Forbidden: set by the DeviceClass") {
		t.Errorf("a claim's own maxSharedMemorySize: %v", err)
	}
}

// sameList reports whether two lists hold the same items, none and an empty
// list being the same.
func sameList[T any](a, b []T) bool {
	return (len(a) == 0 && len(b) == 0) || reflect.DeepEqual(a, b)
}

package v1alpha1_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// FuzzDecode feeds a claim's opaque parameters, which any tenant who can
// create a ResourceClaim writes, to Decode. What it accepts is defaulted
// and valid, and survives an encode and a second decode unchanged; what it
// refuses is refused naming where, under the path it is given.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["p"]}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mode":"ipvlan","interfaceName":"data0","mtu":9000,"vlan":7,` +
			`"addresses":["10.0.0.5/24","fd00::5/64"],"routes":[{"destination":"default","gateway":"10.0.0.1"},{"destination":"fd01::/64"}]}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"A":"1","_b":"x\u0000y"}}`,
		// Refused: unknown and duplicate fields, bad values, another group.
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtuu":1500}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtu":1500,"mtu":9000}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtu":99999999999999999999999}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","vlan":-1,"mtu":1e3}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"a/b\n"}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","macvlanMode":"passthru"}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"CARVE_NET_PARENT":"eth0"}}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","metadata":{"name":"x"}}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"List","items":[]}`,
		`{"APIVERSION":"carve.dev/v1alpha1","kind":"DeviceConfig"}`,
		`{"apiVersion":"v1","kind":"Pod"}`,
		`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","routes":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}`,
		`[1,2]`, `null`, ``, "\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		obj, err := v1alpha1.Decode(raw, path)
		if err != nil {
			if !strings.Contains(err.Error(), "parameters") {
				t.Fatalf("the error does not say where: %v", err)
			}
			return
		}
		var errs []error
		switch c := obj.(type) {
		case *v1alpha1.DeviceConfig:
			for _, e := range v1alpha1.ValidateDeviceConfig(c, path) {
				errs = append(errs, e)
			}
		case *v1alpha1.NetworkConfig:
			if c.Mode == "" || c.InterfaceName == "" || (c.Mode == "macvlan") != (c.MacvlanMode != "") || (c.Mode == "ipvlan") != (c.IPVlanMode != "") {
				t.Fatalf("not defaulted: %+v", c)
			}
			for _, e := range v1alpha1.ValidateNetworkConfig(c, path) {
				errs = append(errs, e)
			}
		default:
			t.Fatalf("decoded a %T", obj)
		}
		if len(errs) > 0 {
			t.Fatalf("accepted %q, which does not validate: %v", raw, errs)
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		if gvk.GroupVersion() != v1alpha1.SchemeGroupVersion {
			t.Fatalf("accepted %s", gvk)
		}
		out, err := json.Marshal(obj)
		if err != nil {
			t.Fatalf("encode %+v: %v", obj, err)
		}
		again, err := v1alpha1.Decode(out, path)
		if err != nil {
			t.Fatalf("%q decoded, but its encoding %s does not: %v", raw, out, err)
		}
		// Compared as encodings: an empty list or map and a missing one
		// are the same config (omitempty).
		if out2, err := json.Marshal(again); err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the config:\n%s\n%s (%v)", out, out2, err)
		}
	})
}

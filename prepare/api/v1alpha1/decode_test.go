package v1alpha1_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

var path = field.NewPath("parameters")

func TestDecodeAppliesDefaults(t *testing.T) {
	obj, err := v1alpha1.Decode([]byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["p"]}`), path)
	if err != nil {
		t.Fatal(err)
	}
	n, ok := obj.(*v1alpha1.NetworkConfig)
	if !ok {
		t.Fatalf("decoded a %T, want *NetworkConfig", obj)
	}
	if n.Mode != "macvlan" || n.MacvlanMode != "vepa" || n.IPVlanMode != "" || n.InterfaceName != "net1" || n.Kind != "NetworkConfig" {
		t.Errorf("defaults: %+v", n)
	}
	obj, err = v1alpha1.Decode([]byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mode":"ipvlan","interfaceName":"data0"}`), path)
	if err != nil {
		t.Fatal(err)
	}
	if n := obj.(*v1alpha1.NetworkConfig); n.IPVlanMode != "l2" || n.MacvlanMode != "" || n.InterfaceName != "data0" {
		t.Errorf("ipvlan defaults: %+v", n)
	}
}

// Every refusal names what is wrong and where.
func TestDecodeRefusesNamingTheField(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{`{"apiVersion":"carve.dev/v1","kind":"NetworkConfig"}`, "parameters.apiVersion"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"FPGAConfig"}`, `parameters.kind: Unsupported value: "FPGAConfig"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"512Ki"}`, `parameters.sharedMemorySize: Invalid value: "512Ki": must be between 1Mi and 1Ti`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"2Ti"}`, `parameters.sharedMemorySize: Invalid value: "2Ti"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"-1Gi"}`, `parameters.sharedMemorySize`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"1.5"}`, `parameters.sharedMemorySize: Invalid value: "1500m": not a whole number of bytes`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"lots"}`, `quantities must match`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","shmSize":"1Gi"}`, `unknown field "shmSize"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtuu":1500}`, `unknown field "mtuu"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtu":1500,"mtu":9000}`, `duplicate field "mtu"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtu":12}`, "parameters.mtu"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","routes":[{"destination":"x"}]}`, "parameters.routes[0].destination"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mode":"ipvlan","macvlanMode":"vepa"}`, "parameters.macvlanMode"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"1BAD":"x"}}`, "parameters.env[1BAD]"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","openFamilies":["ipv4"]}`, `parameters.openFamilies[0]: Unsupported value: "ipv4": supported values: "IPv4", "IPv6"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","openFamilies":["IPv6","IPv6"]}`, `parameters.openFamilies[1]: Duplicate value: "IPv6"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["88F7"]}`, `parameters.ethertypes[0]: Invalid value: "88F7": "88F7": not 0x-prefixed hex`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x5DC"]}`, `parameters.ethertypes[0]: Invalid value: "0x5DC": "0x5DC": under 0x0600, an 802.3 length`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x8100"]}`, `"0x8100": a VLAN tag`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x88a8"]}`, `"0x88a8": a VLAN tag`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x86DD"]}`, `IPv4, ARP and IPv6 are every share's already`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x10000"]}`, `not a 16-bit hex number`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x88F7","0x88f7"]}`, `parameters.ethertypes[1]: Duplicate value: "0x88f7 (also ethertypes[0])"`},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x8801","0x8802","0x8803","0x8804","0x8805","0x8806","0x8807","0x8808","0x8809"]}`, `parameters.ethertypes: Too many: 9: must have at most 8 items`},
		{`[1,2]`, "not a JSON object"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"eth0"}`, "parameters.interfaceName: Invalid value: \"eth0\": reserved"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"lo"}`, "reserved"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","routes":[{"destination":"default"}]}`, "parameters.routes[0].gateway: Required value"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","routes":[{"destination":"10.0.0.0/8","gateway":"fd00::1"}]}`, "address family"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","addresses":["10.0.0.5/24","10.0.0.5/16"]}`, "parameters.addresses[1]: Duplicate value"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"CARVE_NET_PARENT":"eth0"}}`, "parameters.env[CARVE_NET_PARENT]: Forbidden"},
		{`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"carve_x":"y"}}`, "parameters.env[carve_x]: Forbidden"},
	} {
		_, err := v1alpha1.Decode([]byte(tc.raw), path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.raw, err, tc.want)
		}
	}
}

func TestDecodeGPUConfig(t *testing.T) {
	obj, err := v1alpha1.Decode([]byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"4Gi"}`), path)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := obj.(*v1alpha1.GPUConfig)
	if !ok || g.SharedMemorySize == nil || g.SharedMemorySize.Value() != 4<<30 {
		t.Fatalf("decoded %#v", obj)
	}
	if obj, err = v1alpha1.Decode([]byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig"}`), path); err != nil || obj.(*v1alpha1.GPUConfig).SharedMemorySize != nil {
		t.Errorf("an empty GPUConfig: %#v %v", obj, err)
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	in := &v1alpha1.NetworkConfig{Pools: []string{"a"}, Routes: []v1alpha1.Route{{Destination: "default", Gateway: "10.0.0.1"}}}
	out := in.DeepCopy()
	out.Pools[0], out.Routes[0].Gateway = "b", "10.0.0.2"
	if in.Pools[0] != "a" || in.Routes[0].Gateway != "10.0.0.1" {
		t.Errorf("the copy shares memory with the original: %+v", in)
	}
	if _, ok := out.DeepCopyObject().(*v1alpha1.NetworkConfig); !ok {
		t.Error("DeepCopyObject does not return a *NetworkConfig")
	}
}

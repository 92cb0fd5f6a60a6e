package nodeconfig_test

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/slices/nodeconfig"
)

const full = `
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
driverName: net.example.com
netdev:
  include: ["ens*", "eth0"]
  exclude: ["ens9*"]
  includeVirtual: true
  bandwidth:
  - interface: eth*
    egress: 10G
    ingress: 5G
  - interface: veth*
    egress: 1G
  maxSharesPerNIC: 64
requestPolicies:
  nic:
    egressBandwidth: {default: 100M, min: 10M, step: 10M, max: 5G}
  llc:
    ways: {default: "2", min: "1", step: "1"}
`

func TestDecodeFull(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte(full))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if cfg.DriverName != "net.example.com" || !cfg.Netdev.IncludeVirtual || len(cfg.Netdev.Include) != 2 || cfg.SharesPerNIC() != 64 {
		t.Errorf("decoded %+v", cfg)
	}
	eg, in, ok := cfg.BandwidthFor("eth0")
	if !ok || eg.String() != "10G" || in.String() != "5G" {
		t.Errorf("BandwidthFor(eth0) = %v %v %v", eg.String(), in.String(), ok)
	}
	if eg, in, ok := cfg.BandwidthFor("veth3"); !ok || eg.String() != "1G" || in.String() != "1G" {
		t.Errorf("BandwidthFor(veth3) = %v %v %v, want ingress to default to egress", eg.String(), in.String(), ok)
	}
	if _, _, ok := cfg.BandwidthFor("ens1"); ok {
		t.Errorf("BandwidthFor(ens1) matched no entry but returned ok")
	}
	pol, ok := cfg.Policy("nic", "egressBandwidth")
	if !ok || pol.Default.String() != "100M" || pol.Step.String() != "10M" || pol.Max.String() != "5G" {
		t.Errorf("nic egress policy = %+v %v", pol, ok)
	}
}

// netdev.maxSharesPerNIC defaults, and is kept as written.
func TestMaxSharesPerNIC(t *testing.T) {
	head := "apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"
	for _, tc := range []struct {
		doc  string
		want int64
	}{
		{head, nodeconfig.DefaultMaxSharesPerNIC},
		{head + "netdev:\n  maxSharesPerNIC: 2\n", 2},
		{head + "netdev:\n  maxSharesPerNIC: 100000\n", 100000},
	} {
		cfg, err := nodeconfig.Decode([]byte(tc.doc))
		if err != nil {
			t.Fatalf("Decode: %v\n%s", err, tc.doc)
		}
		if got := cfg.SharesPerNIC(); got != tc.want {
			t.Errorf("SharesPerNIC() = %d, want %d; doc:\n%s", got, tc.want, tc.doc)
		}
	}
	if nodeconfig.DefaultMaxSharesPerNIC != 256 || nodeconfig.Default().SharesPerNIC() != 256 {
		t.Errorf("the default is %d, documented as 256", nodeconfig.Default().SharesPerNIC())
	}
}

func TestDefault(t *testing.T) {
	cfg, err := nodeconfig.Load("")
	if err != nil || cfg.DriverName != "carve.dev" {
		t.Fatalf("Load(\"\") = %+v, %v", cfg, err)
	}
	cfg, err = nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"))
	if err != nil || cfg.DriverName != "carve.dev" {
		t.Fatalf("minimal config = %+v, %v", cfg, err)
	}
}

// Every bad input is an error that says where it is.
// TestPoolScope: a pool is cluster-wide unless its node config says Node.
func TestPoolScope(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n" +
		"  - {name: shared, cidr: 10.0.0.0/24}\n  - {name: cluster, cidr: 10.0.1.0/24, scope: Cluster}\n  - {name: mine, cidr: 10.0.2.0/24, scope: Node}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"shared": true, "cluster": true, "mine": false} {
		p, ok := cfg.Pool(name)
		if !ok || p.ClusterWide() != want {
			t.Errorf("pool %s: found %v, cluster-wide %v, want %v", name, ok, p.ClusterWide(), want)
		}
	}
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	head := "apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"
	for _, tc := range []struct{ doc, want string }{
		{head + "netdev:\n  bogus: 1\n", `netdev.bogus`},
		{head + "netdevs: {}\n", `netdevs`},
		{head + "netdev:\n  bandwidth:\n  - interface: eth0\n    egress: 10Q\n", `netdev.bandwidth[0].egress`},
		{head + "netdev:\n  bandwidth:\n  - interface: eth0\n    egress: -1G\n", `netdev.bandwidth[0].egress`},
		{head + "netdev:\n  bandwidth:\n  - egress: 1G\n", `netdev.bandwidth[0].interface`},
		{head + "netdev:\n  include: ['[']\n", `netdev.include[0]`},
		{head + "netdev:\n  maxSharesPerNIC: 0\n", `netdev.maxSharesPerNIC: Invalid value: 0: must be at least 1`},
		{head + "netdev:\n  maxSharesPerNIC: -2\n", `netdev.maxSharesPerNIC: Invalid value: -2: must be at least 1`},
		{head + "netdev:\n  maxSharesPerNIC: many\n", `netdev.maxSharesPerNIC`},
		{head + "netdev:\n  maxSharesPerNIC: 2.5\n", `netdev.maxSharesPerNIC`},
		{head + "requestPolicies:\n  nic:\n    shares: {default: 2}\n", `requestPolicies[nic][shares]`},
		{head + "requestPolicies:\n  fpga: {}\n", `requestPolicies[fpga]`},
		{head + "requestPolicies:\n  gpu:\n    ways: {default: 1}\n", `requestPolicies[gpu][ways]`},
		{head + "requestPolicies:\n  nic:\n    ways: {default: 1}\n", `requestPolicies[nic][ways]`},
		{head + "requestPolicies:\n  nic:\n    egressBandwidth: {default: 1M, min: 2M}\n", `requestPolicies[nic][egressBandwidth].default`},
		{head + "requestPolicies:\n  nic:\n    egressBandwidth: {min: 2M}\n", `requestPolicies[nic][egressBandwidth].default`},
		{head + "netdev:\n  pools:\n  - {name: p, cidr: 10.0.0.0/24, scope: Global}\n", `netdev.pools[0].scope: Unsupported value: "Global"`},
		{head + "driverName: Not_A_Name\n", `driverName`},
		{"apiVersion: v1\nkind: NodeConfig\n", `apiVersion`},
		{head + "kind: NodeConfig\n", `already set`},
		{"apiVersion: [\n", `decode`},
	} {
		_, err := nodeconfig.Decode([]byte(tc.doc))
		if err == nil {
			t.Errorf("no error for:\n%s", tc.doc)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %q does not mention %q; doc:\n%s", err, tc.want, tc.doc)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("netdev: {bandwidth: [{interface: '*', egress: 1e3}]}"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		cfg, err := nodeconfig.Decode(doc)
		if err != nil {
			return
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("decoded config fails validation: %v", errs)
		}
		// What decodes must encode and decode to the same config.
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := nodeconfig.Decode(out)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", out, err)
		}
		if again.DriverName != cfg.DriverName || len(again.Netdev.Bandwidth) != len(cfg.Netdev.Bandwidth) {
			t.Fatalf("round trip changed the config: %+v vs %+v", cfg, again)
		}
	})
}

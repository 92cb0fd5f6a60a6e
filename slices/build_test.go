package slices_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func build(t testing.TB, tree *sysfstest.Tree, cfg *nodeconfig.NodeConfig) slices.Result {
	t.Helper()
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root, Net: discovery.NetFilter{
		Include: cfg.Netdev.Include, Exclude: cfg.Netdev.Exclude, IncludeVirtual: cfg.Netdev.IncludeVirtual,
	}})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return slices.Build(inv, cfg, "node-a")
}

func devices(res slices.Result) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, pool := range res.Resources.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				out[d.Name] = d
			}
		}
	}
	return out
}

func str(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourceapi.Device, name resourceapi.QualifiedName) (int64, bool) {
	if a, ok := d.Attributes[name]; ok && a.IntValue != nil {
		return *a.IntValue, true
	}
	return 0, false
}

func withEth0Bandwidth(t *testing.T) *nodeconfig.NodeConfig {
	cfg, err := nodeconfig.Decode([]byte(`
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  bandwidth:
  - interface: eth0
    egress: 10G
    ingress: 8G
requestPolicies:
  nic:
    egressBandwidth: {default: 100M, min: 10M, step: 10M}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestContractOnTypicalNode(t *testing.T) {
	res := build(t, sysfstest.Typical(t.TempDir()), withEth0Bandwidth(t))
	devs := devices(res)
	var devNames []string
	for n := range devs {
		devNames = append(devNames, n)
	}
	want := []string{"fpga-0000-3b-00-0", "fpga-0000-5e-00-0", "llc-0", "llc-1", "nic-0000-00-03-0", "nic-0000-17-00-0", "nic-0000-17-00-1"}
	if len(devs) != len(want) {
		t.Fatalf("devices %v, want %v (GPUs unpublished until NVML confirms them)", devNames, want)
	}
	for _, n := range want {
		d, ok := devs[n]
		if !ok {
			t.Fatalf("device %s missing from %v", n, devNames)
		}
		if str(d, names.AttrKind) == "" {
			t.Errorf("%s has no kind", n)
		}
	}

	pf := devs["nic-0000-17-00-0"]
	if str(pf, "kind") != "nic" || str(pf, "ifName") != "ens1f0np0" || str(pf, "mac") != "b8:ce:f6:00:00:01" ||
		str(pf, "pciAddress") != "0000:17:00.0" || str(pf, "resource.kubernetes.io/pcieRoot") != "pci0000:16" {
		t.Errorf("PF attributes = %v", pf.Attributes)
	}
	if n, ok := intAttr(pf, "numaNode"); !ok || n != 0 {
		t.Errorf("PF numaNode = %v %v, want 0", n, ok)
	}
	if v, _ := intAttr(pf, "sriovTotalVFs"); v != 8 {
		t.Errorf("PF sriovTotalVFs = %d", v)
	}
	eg := pf.Capacity[names.CapEgressBandwidth]
	if eg.Value.Value() != 25_000_000_000 || pf.AllowMultipleAllocations == nil || !*pf.AllowMultipleAllocations {
		t.Errorf("PF egress = %v, allowMultiple %v; want 25G, shareable", eg.Value.String(), pf.AllowMultipleAllocations)
	}
	if rp := eg.RequestPolicy; rp == nil || rp.Default.String() != "100M" || rp.ValidRange == nil || rp.ValidRange.Step.String() != "10M" {
		t.Errorf("PF egress policy = %+v, want the configured 100M default, 10M step", rp)
	}
	if rp := pf.Capacity[names.CapIngressBandwidth].RequestPolicy; rp == nil || rp.Default.Value() != 250_000_000 {
		t.Errorf("PF ingress policy = %+v, want the built-in default of 1%% of the link", rp)
	}

	down := devs["nic-0000-17-00-1"]
	if down.AllowMultipleAllocations != nil || len(down.Capacity) != 0 {
		t.Errorf("down port of unknown speed = %+v, want no capacity and not shareable", down)
	}
	virtio := devs["nic-0000-00-03-0"]
	veg, vin := virtio.Capacity[names.CapEgressBandwidth], virtio.Capacity[names.CapIngressBandwidth]
	if veg.Value.String() != "10G" || vin.Value.String() != "8G" || virtio.AllowMultipleAllocations == nil {
		t.Errorf("eth0 with configured bandwidth = %+v", virtio.Capacity)
	}
	if _, ok := intAttr(virtio, "numaNode"); ok {
		t.Errorf("eth0 has numaNode though sysfs says -1")
	}

	llc := devs["llc-1"]
	if id, _ := intAttr(llc, "cacheId"); id != 1 || str(llc, "cpus") != "16-31" {
		t.Errorf("llc-1 = %+v", llc)
	}
	// resctrl with L3 allocation and MBA: shareable, the default group
	// keeping min_cbm_bits (1) of the 16 ways.
	if llc.AllowMultipleAllocations == nil || !*llc.AllowMultipleAllocations {
		t.Errorf("llc-1 not offered for sharing on a node with resctrl")
	}
	if w := llc.Capacity[names.CapWays]; w.Value.Value() != 15 || w.RequestPolicy == nil || w.RequestPolicy.Default.Value() != 1 {
		t.Errorf("llc-1 ways = %+v, want 15 (one kept by the default group), 1 by default", w)
	}
	if s := llc.Capacity[names.CapSize]; s.Value.Value() != 30<<20 || s.RequestPolicy.ValidRange.Step.Value() != 2<<20 {
		t.Errorf("llc-1 size = %+v, want 30Mi in steps of one way (2Mi)", s)
	}
	if mb := llc.Capacity[names.CapMemoryBandwidth]; mb.Value.Value() != 100 || mb.RequestPolicy == nil || mb.RequestPolicy.Default.Value() != 0 ||
		mb.RequestPolicy.ValidRange.Step.Value() != 10 {
		t.Errorf("llc-1 memoryBandwidth = %+v, want 100 (percent), no cap by default, steps of 10", mb)
	}

	fpga := devs["fpga-0000-3b-00-0"]
	if str(fpga, "vendorID") != "0x10ee" || str(fpga, "deviceID") != "0x5004" || str(fpga, "pciAddress") != "0000:3b:00.0" {
		t.Errorf("fpga = %v", fpga.Attributes)
	}
	if dfl := devs["fpga-0000-5e-00-0"]; str(dfl, "compatID") != sysfstest.TypicalCompatID || str(dfl, "afuID") != sysfstest.TypicalAFUID {
		t.Errorf("DFL card = %v, want its compat and AFU ids", dfl.Attributes)
	}
	if _, ok := fpga.Attributes["afuID"]; ok {
		t.Errorf("XRT card has an afuID, but sysfs shows none")
	}
	if len(res.Notices) == 0 {
		t.Errorf("no notices, want ones for the down port and the GPU")
	}
}

func TestNotShareableWhereNotEnforceable(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	tree.SetKernelConfig("BPF_SYSCALL", "NET_XGRESS", "MACVLAN") // no HTB, no IFB
	tree.Remove("sys/fs/resctrl")
	devs := devices(build(t, tree, withEth0Bandwidth(t)))
	for _, name := range []string{"nic-0000-17-00-0", "nic-0000-00-03-0", "llc-0"} {
		d := devs[name]
		if d.AllowMultipleAllocations != nil {
			t.Errorf("%s shareable on a node that cannot enforce it", name)
		}
		if len(d.Capacity) == 0 {
			t.Errorf("%s lost its capacity", name)
		}
		for c, v := range d.Capacity {
			if v.RequestPolicy != nil {
				t.Errorf("%s capacity %s has a request policy but is not shareable", name, c)
			}
		}
	}
	ways := devs["llc-0"].Capacity[names.CapWays]
	if w := ways.Value.Value(); w != 16 {
		t.Errorf("llc-0 ways without resctrl = %d, want associativity 16", w)
	}
}

func TestLargeNodeSplitsPool(t *testing.T) {
	res := build(t, sysfstest.Large(t.TempDir()), nodeconfig.Default())
	pool := res.Resources.Pools["node-a"]
	total := 0
	seen := map[string]bool{}
	for _, s := range pool.Slices {
		if len(s.Devices) > resourceapi.ResourceSliceMaxDevices {
			t.Errorf("slice with %d devices, over the API's %d", len(s.Devices), resourceapi.ResourceSliceMaxDevices)
		}
		for _, d := range s.Devices {
			if seen[d.Name] {
				t.Errorf("device %s twice", d.Name)
			}
			seen[d.Name] = true
		}
		total += len(s.Devices)
	}
	// 16 PFs + 2048 VFs + 2 LLCs + 4 FPGAs.
	if total != 2070 || len(pool.Slices) != 17 {
		t.Errorf("%d devices in %d slices, want 2070 in 17", total, len(pool.Slices))
	}
	objs := slices.Objects("carve.dev", "node-a", res.Resources)
	for _, o := range objs {
		if o.Spec.Pool.ResourceSliceCount != 17 || *o.Spec.NodeName != "node-a" || o.Spec.Driver != "carve.dev" {
			t.Errorf("slice %s spec pool %+v node %v", o.Name, o.Spec.Pool, *o.Spec.NodeName)
		}
	}
}

func TestStableOutput(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	a, b := build(t, tree, nodeconfig.Default()), build(t, tree, nodeconfig.Default())
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two builds of one node differ")
	}
}

func TestEmptyNodeHasOneEmptySlice(t *testing.T) {
	res := slices.Build(&discovery.Inventory{}, nodeconfig.Default(), "node-a")
	if s := res.Resources.Pools["node-a"].Slices; len(s) != 1 || len(s[0].Devices) != 0 {
		t.Errorf("empty node slices = %+v", s)
	}
}

func TestVirtualNICNamesStayUnique(t *testing.T) {
	inv := &discovery.Inventory{NICs: []discovery.NIC{{Name: "eth_0", Virtual: true}, {Name: "eth.0", Virtual: true}, {Name: "Eth-0", Virtual: true}}}
	devs := devices(slices.Build(inv, nodeconfig.Default(), "n"))
	if len(devs) != 3 {
		t.Errorf("devices %v, want three distinct names", devs)
	}
}

// An LLC is shareable only where resctrl can hold shares apart.
func TestLLCSharingNeedsRoom(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		cbm, shareable            string
		minBits, closids, wantWay int
	}{
		{"one CLOSID", "ffff", "0", 1, 1, 0},
		{"no ways beside the default group", "3", "0", 2, 16, 0},
		{"shareable bits hold the default group", "7ff", "600", 1, 16, 9},
		{"AMD, min_cbm_bits 0 counted as 1", "ffff", "0", 0, 16, 15},
	} {
		tree := sysfstest.New(t.TempDir())
		tree.AddLLC(sysfstest.LLC{ID: 0, CPUs: []int{0, 1}, Size: "16M", Ways: 16})
		tree.AddResctrlShareable(tc.cbm, tc.shareable, tc.minBits, tc.closids)
		d := devices(build(t, tree, nodeconfig.Default()))["llc-0"]
		if shareable := d.AllowMultipleAllocations != nil; shareable != (tc.wantWay > 0) {
			t.Errorf("%s: shareable %t", tc.name, shareable)
		}
		w := d.Capacity[names.CapWays]
		if tc.wantWay > 0 && w.Value.Value() != int64(tc.wantWay) {
			t.Errorf("%s: ways %s, want %d", tc.name, w.Value.String(), tc.wantWay)
		}
	}
}

// The node config's bandwidth for a link wins over the speed the kernel
// reports: the PF's 25G port, configured at 10G, is published at 10G (its
// borrowing shares' link class and the scheduler take that).
func TestConfiguredBandwidthWinsOverTheKernelsSpeed(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte(`
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  bandwidth:
  - interface: ens1f0np0
    egress: 10G
`))
	if err != nil {
		t.Fatal(err)
	}
	pf := devices(build(t, sysfstest.Typical(t.TempDir()), cfg))["nic-0000-17-00-0"]
	eg, in := pf.Capacity[names.CapEgressBandwidth], pf.Capacity[names.CapIngressBandwidth]
	if eg.Value.String() != "10G" || in.Value.String() != "10G" {
		t.Errorf("a 25G port configured at 10G published %s/%s", eg.Value.String(), in.Value.String())
	}
}

// Where the node config assures the traffic of no share a part of each link
// (unsharedFloorPercent), the shares' floors get the rest: a 10G link with
// 5% for it publishes 9.5G each way, which netdev takes back to 10G for the
// link class (netdev.linkRate).
func TestUnsharedFloorIsLeftOutOfTheCapacity(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte(`
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  unsharedFloorPercent: 5
  bandwidth:
  - interface: ens1f0np0
    egress: 10G
`))
	if err != nil {
		t.Fatal(err)
	}
	pf := devices(build(t, sysfstest.Typical(t.TempDir()), cfg))["nic-0000-17-00-0"]
	eg, in := pf.Capacity[names.CapEgressBandwidth], pf.Capacity[names.CapIngressBandwidth]
	if eg.Value.Value() != 9_500_000_000 || in.Value.Value() != 9_500_000_000 {
		t.Errorf("a 10G link with 5%% for unshared traffic published %s/%s, want 9500M each way", eg.Value.String(), in.Value.String())
	}
}

// A node whose kernel carve cannot guard a NIC claim on offers no NIC, and
// says so for each; its other devices are published as anywhere.
func TestNoNICsLeavesTheOthers(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	cfg, _ := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"))
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	all := slices.Build(inv, cfg, "node-a")
	res := slices.Build(inv, cfg, "node-a", slices.NoNICs("the kernel is older than carve's minimum (Linux 6.1)"))
	kinds := func(r slices.Result) map[string]int {
		n := map[string]int{}
		for _, e := range r.Index {
			n[e.Kind]++
		}
		return n
	}
	got, want := kinds(res), kinds(all)
	if got[names.KindNIC] != 0 || want[names.KindNIC] == 0 {
		t.Errorf("NICs published: %d (without NoNICs: %d), want none", got[names.KindNIC], want[names.KindNIC])
	}
	delete(want, names.KindNIC)
	delete(got, names.KindNIC)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("other devices %v, want %v as without NoNICs", got, want)
	}
	noted := 0
	for _, n := range res.Notices {
		if strings.Contains(n, "older than carve's minimum") && strings.Contains(n, "not offered") {
			noted++
		}
	}
	if noted != len(inv.NICs) {
		t.Errorf("%d notices name the kernel, want one per NIC (%d): %q", noted, len(inv.NICs), res.Notices)
	}
}

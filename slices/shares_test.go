package slices_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// typicalWith builds the typical node (a 25G PF that is up, a port that is
// down, eth0 of configured bandwidth) with more netdev settings.
func typicalWith(t *testing.T, netdev string, opts ...slices.Option) (map[string]resourceapi.Device, slices.Result) {
	t.Helper()
	cfg, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  bandwidth:\n  - {interface: eth0, egress: 10G}\n" + netdev))
	if err != nil {
		t.Fatal(err)
	}
	tree := sysfstest.Typical(t.TempDir())
	inv, err := discovery.Discover(t.Context(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(inv, cfg, "node-a", opts...)
	return devices(res), res
}

// shares is a NIC's "shares" capacity, -1 where it has none.
func shares(t *testing.T, d resourceapi.Device) int64 {
	t.Helper()
	c, ok := d.Capacity[names.CapShares]
	if !ok {
		return -1
	}
	// Every allocation takes exactly 1, asked or not.
	rp := c.RequestPolicy
	if rp == nil || rp.Default == nil || rp.Default.Value() != 1 || rp.ValidRange == nil ||
		rp.ValidRange.Min == nil || rp.ValidRange.Min.Value() != 1 || rp.ValidRange.Max == nil || rp.ValidRange.Max.Value() != 1 ||
		rp.ValidRange.Step != nil || len(rp.ValidValues) != 0 {
		t.Errorf("%s shares policy = %+v, want default 1 in the range [1, 1], no step", d.Name, rp)
	}
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Errorf("%s has a shares capacity but is not shareable", d.Name)
	}
	return c.Value.Value()
}

// The classifier's 2048 shares divided between the node's two NICs of
// known bandwidth give 1024 each; the node config's default of 256 is less.
func TestSharesCapacity(t *testing.T) {
	for _, tc := range []struct {
		name       string
		netdev     string
		opts       []slices.Option
		pf, eth0   int64
		wantNotice string
	}{
		{name: "the default limit", pf: 256, eth0: 256},
		{name: "an admin limit", netdev: "  maxSharesPerNIC: 2\n", pf: 2, eth0: 2},
		{name: "the admin limit above the classifier's part", netdev: "  maxSharesPerNIC: 5000\n", pf: 1024, eth0: 1024},
		{name: "a small classifier", opts: []slices.Option{slices.ClassifierShares(301)}, pf: 151, eth0: 150},
		// The PF, first in the inventory, takes the one share.
		{name: "more NICs than the classifier holds", opts: []slices.Option{slices.ClassifierShares(1)}, pf: 1, eth0: -1,
			wantNotice: "NIC eth0: the classifier's 1 shares are all given to other NICs"},
		// A port whose link is down keeps its part of the classifier,
		// its shares' entries being its own still, but is not shared.
		{name: "a down port of known speed", netdev: "  - {interface: ens1f1np1, egress: 25G}\n  maxSharesPerNIC: 5000\n",
			opts: []slices.Option{slices.ClassifierShares(30)}, pf: 10, eth0: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, res := typicalWith(t, tc.netdev, tc.opts...)
			if got := shares(t, devs["nic-0000-17-00-0"]); got != tc.pf {
				t.Errorf("PF shares = %d, want %d", got, tc.pf)
			}
			if got := shares(t, devs["nic-0000-00-03-0"]); got != tc.eth0 {
				t.Errorf("eth0 shares = %d, want %d", got, tc.eth0)
			}
			if got := shares(t, devs["nic-0000-17-00-1"]); got != -1 {
				t.Errorf("the down port has %d shares, want none", got)
			}
			if tc.wantNotice != "" && !strings.Contains(strings.Join(res.Notices, "\n"), tc.wantNotice) {
				t.Errorf("notices %q lack %q", res.Notices, tc.wantNotice)
			}
		})
	}
}

// "shares" cannot be given another request policy: each share is one.
func TestSharesPolicyNotConfigurable(t *testing.T) {
	_, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nrequestPolicies:\n  nic:\n    shares: {default: 2}\n"))
	if err == nil || !strings.Contains(err.Error(), "requestPolicies[nic][shares]") {
		t.Errorf("a shares policy in the node config: %v, want refused", err)
	}
}

// A node with no NIC, or none that can be shared, publishes no shares and
// divides by nothing.
func TestSharesWithoutShareableNICs(t *testing.T) {
	if devs := devices(slices.Build(&discovery.Inventory{}, nodeconfig.Default(), "n")); len(devs) != 0 {
		t.Errorf("devices of an empty node: %v", devs)
	}
	// Of unknown speed, so not shareable: published whole.
	inv := &discovery.Inventory{Kernel: sysfstestKernel(t), NICs: []discovery.NIC{{Name: "eth9", OperState: "up", Carrier: true}}}
	for name, d := range devices(slices.Build(inv, nodeconfig.Default(), "n")) {
		if _, ok := d.Capacity[names.CapShares]; ok || d.AllowMultipleAllocations != nil {
			t.Errorf("%s = %+v, want published whole without shares", name, d)
		}
	}
	// A classifier of no room: every NIC whole, none divided by zero.
	devs, _ := typicalWith(t, "", slices.ClassifierShares(0))
	for name, d := range devs {
		if _, ok := d.Capacity[names.CapShares]; ok || (strings.HasPrefix(name, "nic-") && d.AllowMultipleAllocations != nil) {
			t.Errorf("%s shareable with a classifier of no room", name)
		}
	}
}

// sysfstestKernel is the typical node's kernel, which can share NICs.
func sysfstestKernel(t *testing.T) discovery.KernelFeatures {
	t.Helper()
	tree := sysfstest.Typical(t.TempDir())
	inv, err := discovery.Discover(t.Context(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	if !inv.Kernel.CanShareNIC() {
		t.Fatal("the typical node's kernel cannot share NICs")
	}
	return inv.Kernel
}

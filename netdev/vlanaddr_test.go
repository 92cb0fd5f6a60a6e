package netdev_test

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// One address may be two shares' in two VLANs of one parent (two tenants'
// subnets on their own VLANs overlap): the classifier keeps addresses by
// parent, VLAN and address. In one VLAN it stays one share's. Needs 802.1Q
// in the kernel (make vmtest's guests have it).
func TestSameAddressInTwoVLANs(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	probe := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "vlanprobe", ParentIndex: parent.Attrs().Index}, VlanId: 4000}
	nettest.SkipIfLacks(t, node.LinkAdd(probe), nettest.LinkKind("vlan"))
	_ = node.LinkDel(probe)
	const addr = "10.77.5.9/24"
	cfg := func(vlan int) *v1alpha1.NetworkConfig {
		return &v1alpha1.NetworkConfig{VLAN: vlan, Addresses: []string{addr}}
	}
	a := b.add("vlan10", "20M", "20M", cfg(10))
	c := b.add("vlan20", "20M", "20M", cfg(20))
	got := map[int]string{}
	allowed, err := b.shaper.AllowedAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range allowed {
		if e.Addr == netip.MustParseAddr("10.77.5.9") {
			got[e.VLAN] = e.MAC
		}
	}
	if got[10] != a.mac || got[20] != c.mac || len(got) != 2 {
		t.Errorf("%s's owners by VLAN: %v, want VLAN 10 %s and VLAN 20 %s", addr, got, a.mac, c.mac)
	}
	// A third share in VLAN 10 cannot have it.
	third := b.alloc("vlan10b", "20M", "20M")
	third.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: cfg(10)})
	if _, err := b.p.Prepare(context.Background(), third, b.dev); err == nil || !strings.Contains(err.Error(), "10.77.5.9") {
		t.Errorf("a second share with %s in VLAN 10: %v, want refused naming the address", addr, err)
	}
}

// A VLAN share prepared by an agent before addresses were kept by VLAN:
// its record names no VLAN and its classifier entries carry none. The
// restarted agent copies them into the VLAN its config names, where the
// classifier now looks, keeping the untagged ones (a running pod's guard
// an older agent loaded looks there); an untagged share's entries stay as
// they are, and nothing of it is copied.
// (No 802.1Q needed: the entries are the old agent's, made here.)
func TestRestoreCopiesVLANSharesAddresses(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, err := node.LinkByName(b.tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	var allocs []prepare.Allocation
	var undos []json.RawMessage
	macs := map[int]string{}
	for i, vlan := range []int{0, 100} {
		a := b.alloc([]string{"untagged", "tagged"}[i], "", "")
		a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{VLAN: vlan, Addresses: []string{"10.77.6.9/24"}}})
		key := a.ShareKey()
		mac := netdev.ShareMAC(key)
		macs[vlan] = mac.String()
		// What the older agent recorded: no VLAN, in its record or
		// its entries.
		undo, _ := json.Marshal(map[string]any{"parent": b.tp.Parent, "link": netdev.LinkName(key), "mac": mac.String(), "addresses": []string{"10.77.6.9/24"}})
		if vlan != 0 {
			// Two shares with one address untagged: only possible as
			// the older agent's VLAN share beside an untagged one on
			// another parent; here both sit on one parent to see that
			// only the VLAN share's entry moves.
			if err := b.shaper.AllowAddr(parent.Attrs().Index+1000, 0, netip.MustParseAddr("10.77.6.9"), mac); err != nil {
				t.Fatal(err)
			}
		} else if err := b.shaper.AllowAddr(parent.Attrs().Index, 0, netip.MustParseAddr("10.77.6.9"), mac); err != nil {
			t.Fatal(err)
		}
		allocs, undos = append(allocs, a), append(undos, undo)
	}
	b.newPreparer("test", b.tp.Subnet, "").Restore(allocs, undos)
	allowed, err := b.shaper.AllowedAddrs()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int{}
	for _, e := range allowed {
		got[e.MAC] = append(got[e.MAC], e.VLAN)
	}
	slices.Sort(got[macs[100]])
	if v := got[macs[0]]; !slices.Equal(v, []int{0}) {
		t.Errorf("the untagged share's entries: VLANs %v, want [0] (left untagged, not copied)", v)
	}
	if v := got[macs[100]]; !slices.Equal(v, []int{0, 100}) {
		t.Errorf("the VLAN share's entries: VLANs %v, want [0 100] (copied into VLAN 100, the untagged one kept)", v)
	}
	for _, m := range macs {
		mac, _ := net.ParseMAC(m)
		_ = b.shaper.DeletePodShares(mac)
	}
}

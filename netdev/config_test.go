package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// A pool hands out distinct addresses, keeps the gateway (and the network
// and broadcast addresses) out, says clearly when it is exhausted, and takes
// addresses back on unprepare. The gateway is not the pool's first address,
// so a pool that skipped the first address instead would hand it out.
func TestAddressPool(t *testing.T) {
	b := newBench(t)
	const gateway = "10.78.0.2"
	p := b.newPreparer("tiny", "10.78.0.0/29", gateway)
	b.p = p
	prefix := netip.MustParsePrefix("10.78.0.0/29")
	seen := map[string]bool{}
	var one *share
	for i := range 5 { // .1 and .3 to .6
		s := b.add(fmt.Sprintf("s%d", i), "", "", &v1alpha1.NetworkConfig{Pools: []string{"tiny"}})
		a, err := netip.ParseAddr(s.ip)
		switch {
		case err != nil || !prefix.Contains(a):
			t.Errorf("share %d: address %q, want one in %s", i, s.ip, prefix)
		case s.ip == gateway:
			t.Errorf("share %d: handed out the gateway %s", i, gateway)
		case s.ip == "10.78.0.0" || s.ip == "10.78.0.7":
			t.Errorf("share %d: handed out the network or broadcast address %s", i, s.ip)
		case seen[s.ip]:
			t.Errorf("share %d: address %s handed out twice", i, s.ip)
		}
		seen[s.ip] = true
		if i == 0 {
			one = s
		}
	}
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Pools: []string{"tiny"}}})
	sixth := prepare.Allocation{ClaimUID: "sixth", Request: "net", Device: "nic0", Kind: "nic", Config: raw}
	if _, err := p.Prepare(context.Background(), sixth, b.dev); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Errorf("sixth share from a /29 with a gateway: %v, want the pool exhausted", err)
	}
	if err := p.Unprepare(context.Background(), one.alloc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(context.Background(), sixth, b.dev); err != nil {
		t.Errorf("after one left: %v", err)
	} else if got := b.specOf(sixth).Addresses; len(got) != 1 || got[0] != one.ip+"/29" {
		t.Errorf("after one left: addresses %v, want the one it freed, %s/29", got, one.ip)
	}
	_ = p.Unprepare(context.Background(), sixth, nil)
}

// ipvlan shares where the kernel has ipvlan, in l2 and in l3 mode (a
// parent keeps one mode, so each on its own node): the interface reaches
// the pod with its address, in that mode and in vepa (so that nothing a
// share sends to a neighbour on the parent bypasses the parent's shaper); a
// bandwidth share of one, told apart by its address (its frames carry the
// parent's MAC), is held to its rate both ways. The address path itself is
// also exercised where there is no ipvlan, on macvlan
// (TestAddressKeyedShareHoldsItsRate). make vmtest runs it on 6.12 and 6.1.
func TestIPVlanShare(t *testing.T) {
	for _, mode := range []string{"l2", "l3"} {
		t.Run(mode, func(t *testing.T) { ipvlanShare(t, mode) })
	}
}

func ipvlanShare(t *testing.T, mode string) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	probe := &netlink.IPVlan{LinkAttrs: netlink.LinkAttrs{Name: "ipvprobe", ParentIndex: parent.Attrs().Index}, Mode: netlink.IPVLAN_MODE_L2}
	nettest.SkipIfLacks(t, node.LinkAdd(probe), nettest.LinkKind("ipvlan"))
	_ = node.LinkDel(probe)
	want := map[string]netlink.IPVlanMode{"l2": netlink.IPVLAN_MODE_L2, "l3": netlink.IPVLAN_MODE_L3}[mode]
	s := b.add("ipv", "", "", &v1alpha1.NetworkConfig{Mode: "ipvlan", IPVlanMode: mode, Pools: []string{"test"}})
	pod, _ := netlink.NewHandleAt(s.pod)
	defer pod.Close()
	if l, err := pod.LinkByName("net1"); err != nil || l.Type() != "ipvlan" {
		t.Errorf("net1 in the pod: %v %v", l, err)
	} else if ipv, ok := l.(*netlink.IPVlan); !ok || ipv.Flag != netlink.IPVLAN_FLAG_VEPA || ipv.Mode != want {
		t.Errorf("net1 in the pod: %+v, want ipvlan %s in vepa", l, mode)
	}

	shaped := b.add("ipv-bw", "20M", "20M", &v1alpha1.NetworkConfig{Mode: "ipvlan", IPVlanMode: mode, Pools: []string{"test"}})
	if keyed, _ := b.shaper.AddressKeyed(); !keyed[bpf.Key{MAC: shaped.mac, Dir: bpf.Egress}] || !keyed[bpf.Key{MAC: shaped.mac, Dir: bpf.Ingress}] {
		t.Errorf("the ipvlan share's entries %v are not keyed by address", keyed)
	}
	if mode == "l3" {
		// l3 routes: the pod's frames leave by the node's routes (the
		// node's own address on the parent, as on a real node), and
		// its address answers no ARP, so the server reaches it through
		// the node's address.
		addr, _ := netlink.ParseAddr("10.77.0.250/24")
		if err := node.AddrAdd(parent, addr); err != nil {
			t.Fatal(err)
		}
		srv, _ := netlink.NewHandleAt(b.tp.Server)
		defer srv.Close()
		peer, _ := srv.LinkByName("peer0")
		dst, _ := netlink.ParseIPNet(shaped.ip + "/32")
		if err := srv.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Dst: dst, Gw: net.ParseIP("10.77.0.250")}); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		goodput, l2 := b.measure(dir, []*share{shaped}, 1500*time.Millisecond)
		gpRatio, l2Ratio := goodput[0]/rate("20M"), l2[0]/rate("20M")
		t.Logf("%s of an ipvlan %s share of 20M: goodput ratio %.3f, L2 ratio %.3f", dir, mode, gpRatio, l2Ratio)
		if lo, hi := nettest.GoodputBand(0.956*0.9, 0.956*1.1); gpRatio < lo || gpRatio > hi || l2Ratio < 0.9 {
			t.Errorf("%s of an ipvlan %s share of 20M: goodput ratio %.3f is outside %.3f–%.3f, or L2 ratio %.3f under 0.9", dir, mode, gpRatio, lo, hi, l2Ratio)
		}
	}
}

package netdev_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/netdev/netdevtest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// A pool hands out distinct addresses, keeps the gateway out, says clearly
// when it is exhausted, and takes addresses back on unprepare.
func TestAddressPool(t *testing.T) {
	b := newBench(t)
	p := b.newPreparer("tiny", "10.78.0.0/30", "")
	b.p = p
	one := b.add("one", "", "", &v1alpha1.NetworkConfig{Pools: []string{"tiny"}})
	two := b.add("two", "", "", &v1alpha1.NetworkConfig{Pools: []string{"tiny"}})
	if one.ip == two.ip || one.ip == "" {
		t.Errorf("addresses %s and %s", one.ip, two.ip)
	}
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Pools: []string{"tiny"}}})
	third := prepare.Allocation{ClaimUID: "third", Request: "net", Device: "nic0", Kind: "nic", Config: raw}
	if _, err := p.Prepare(context.Background(), third, b.dev); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Errorf("third share from a /30: %v, want the pool exhausted", err)
	}
	if err := p.Unprepare(context.Background(), one.alloc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(context.Background(), third, b.dev); err != nil {
		t.Errorf("after one left: %v", err)
	}
	_ = p.Unprepare(context.Background(), third, nil)
}

// ipvlan shares where the kernel has ipvlan: the interface reaches the pod
// with its address; a bandwidth share of one is refused, since the
// classifier keys on MACs and ipvlan children share the parent's.
func TestIPVlanShare(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	probe := &netlink.IPVlan{LinkAttrs: netlink.LinkAttrs{Name: "ipvprobe", ParentIndex: parent.Attrs().Index}, Mode: netlink.IPVLAN_MODE_L2}
	netdevtest.SkipIfLacks(t, node.LinkAdd(probe), netdevtest.LinkKind("ipvlan"))
	_ = node.LinkDel(probe)
	s := b.add("ipv", "", "", &v1alpha1.NetworkConfig{Mode: "ipvlan", IPVlanMode: "l2", Pools: []string{"test"}})
	pod, _ := netlink.NewHandleAt(s.pod)
	defer pod.Close()
	if l, err := pod.LinkByName("net1"); err != nil || l.Type() != "ipvlan" {
		t.Errorf("net1 in the pod: %v %v", l, err)
	}
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Mode: "ipvlan"}})
	a := b.alloc("ipv-bw", "100M", "")
	a.Config = raw
	if _, err := b.p.Prepare(context.Background(), a, b.dev); err == nil || !strings.Contains(err.Error(), "ipvlan") {
		t.Errorf("bandwidth share of an ipvlan: %v, want refused", err)
	}
}

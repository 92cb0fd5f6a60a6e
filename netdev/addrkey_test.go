package netdev_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
)

// addAddrNoDAD gives a device in ns an address; an IPv6 one is usable at
// once (no DAD).
func addAddrNoDAD(t *testing.T, ns netns.NsHandle, dev, cidr string) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(cidr)
	if addr.IP.To4() == nil {
		addr.Flags |= unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, addr); err != nil {
		t.Fatalf("add %s to %s: %v", cidr, dev, err)
	}
}

// A share told apart by address, as ipvlan shares are, here on a macvlan
// child (this kernel has no ipvlan; KeyByAddress makes the preparer key it
// as it keys ipvlan's): with the hook's netns record left out, its egress
// is found by source address alone, and its ingress by destination
// address. Both are held to the limit over IPv4 (a pool address) and IPv6
// (a static one) at once, while a neighbour without a share and the node's
// own traffic on the parent run unlimited, and the node's traffic stays
// off the IFB.
func TestAddressKeyedShareHoldsItsRate(t *testing.T) {
	b := newBench(t)
	netdev.KeyByAddress(b.p)
	addAddrNoDAD(t, b.tp.Server, "peer0", "fd77::1/64")
	addAddrNoDAD(t, b.tp.Node, b.tp.Parent, "10.77.0.250/24")
	addAddrNoDAD(t, b.tp.Node, b.tp.Parent, "fd77::250/64")

	const limit = "20M"
	a := b.alloc("keyed", limit, limit)
	spec := b.prepareSpec(a, &v1alpha1.NetworkConfig{Addresses: []string{"fd77::11/64"}, Pools: []string{"test"}})
	keyed := b.tp.NewPod("keyed")
	if err := hook.AttachToPod(b.tp.Node, keyed, spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Addresses) != 2 {
		t.Fatalf("addresses %v, want the static IPv6 and one from the pool", spec.Addresses)
	}
	v4 := strings.Split(spec.Addresses[1], "/")[0]
	free := b.add("free", "", "", &v1alpha1.NetworkConfig{Addresses: []string{"fd77::12/64"}, Pools: []string{"test"}})
	if keyedEntries, _ := b.shaper.AddressKeyed(); !keyedEntries[bpf.Key{MAC: spec.MAC, Dir: bpf.Egress}] || !keyedEntries[bpf.Key{MAC: spec.MAC, Dir: bpf.Ingress}] {
		t.Fatalf("the share's entries %v are not keyed by address", keyedEntries)
	}

	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	ifbName := netdev.IFBName(parent.Attrs().Index)
	var stats []map[bpf.Key]bpf.Counters
	var ifbTx, classOut []uint64
	var dir bpf.Direction
	mark := func() {
		classOut = append(classOut, b.classSent(dir))
		st, err := b.shaper.Stats()
		if err != nil {
			t.Error(err)
		}
		stats = append(stats, st)
		ifb, err := node.LinkByName(ifbName)
		if err != nil {
			t.Error(err)
			ifbTx = append(ifbTx, 0)
			return
		}
		ifbTx = append(ifbTx, ifb.Attrs().Statistics.TxBytes)
	}
	flow := func(from, to netns.NsHandle, host string, port int) nettest.Flow {
		return nettest.Flow{From: from, To: to, ToAddr: net.JoinHostPort(host, fmt.Sprint(port))}
	}
	for _, dir = range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		// Flows 0-1: the share (IPv4, IPv6); 2-3: the neighbour; 4-5
		// (ingress): the node itself.
		var flows []nettest.Flow
		if dir == bpf.Egress {
			flows = []nettest.Flow{flow(keyed, b.tp.Server, b.tp.ServerIP, 5301), flow(keyed, b.tp.Server, "fd77::1", 5302),
				flow(free.pod, b.tp.Server, b.tp.ServerIP, 5303), flow(free.pod, b.tp.Server, "fd77::1", 5304)}
		} else {
			flows = []nettest.Flow{flow(b.tp.Server, keyed, v4, 5311), flow(b.tp.Server, keyed, "fd77::11", 5312),
				flow(b.tp.Server, free.pod, free.ip, 5313), flow(b.tp.Server, free.pod, "fd77::12", 5314),
				flow(b.tp.Server, b.tp.Node, "10.77.0.250", 5315), flow(b.tp.Server, b.tp.Node, "fd77::250", 5316)}
		}
		stats, ifbTx, classOut = nil, nil, nil
		res, err := nettest.RunFlows(flows, time.Second, 2500*time.Millisecond, mark)
		if err != nil {
			t.Fatal(err)
		}
		k := bpf.Key{MAC: spec.MAC, Dir: dir}
		shareL2 := float64(stats[1][k].Bytes - stats[0][k].Bytes)
		l2Ratio := shareL2 * 8 / res[0].Duration.Seconds() / rate(limit)
		gpRatio := (res[0].Goodput() + res[1].Goodput()) / rate(limit)
		outRatio := float64(classOut[1]-classOut[0]) * 8 / res[0].Duration.Seconds() / rate(limit)
		t.Logf("%s: share (%s) IPv4 %.1f + IPv6 %.1f Mbit/s, goodput ratio %.3f, L2 ratio %.3f, its class let out %.3f; neighbour IPv4 %.0f, IPv6 %.0f Mbit/s",
			dir, limit, res[0].Goodput()/1e6, res[1].Goodput()/1e6, gpRatio, l2Ratio, outRatio, res[2].Goodput()/1e6, res[3].Goodput()/1e6)
		// As in TestSharesHoldTheirRates: 0.956 of the rate is the
		// limit met to within 1%; IPv6's larger header costs a little.
		// Above it the bound is looser: a receiver starved of CPU by the
		// neighbour's 10 Gbit/s flows reads a backlog inside the window
		// (seen: 1.105 with the classifier's L2 at 0.947), while traffic
		// that escaped the share would read as many times the limit.
		// What the share is charged is judged after its queue, where
		// its class lets it out: the classifier counts frames before
		// it, drops included, and since issue 37 a drop under the
		// neighbours' load is a whole super-packet (the classifier
		// read 1.06-1.11 while the class let out 1.00).
		if gpRatio < 0.956*0.9 || gpRatio > 0.956*1.25 || l2Ratio < 0.9 || outRatio < 0.9 || outRatio > 1.02 {
			t.Errorf("%s share of %s by address: goodput ratio %.3f is outside 0.956 -10%%/+25%%, L2 ratio %.3f under 0.9, or its class let out %.3f of its rate, outside 0.9-1.02", dir, limit, gpRatio, l2Ratio, outRatio)
		}
		for i := 2; i < len(flows); i++ {
			if res[i].Goodput() < 2*rate(limit) {
				t.Errorf("%s flow to %s of no share: %.1f Mbit/s, held near the share's %s", dir, flows[i].ToAddr, res[i].Goodput()/1e6, limit)
			}
		}
		if dir == bpf.Ingress {
			nodeBits := (res[4].Goodput() + res[5].Goodput()) / 1e6
			ifbBytes := ifbTx[1] - ifbTx[0]
			t.Logf("ingress: the node's own IPv4 %.0f + IPv6 %.0f Mbit/s; IFB sent %d bytes, the share was charged %.0f",
				res[4].Goodput()/1e6, res[5].Goodput()/1e6, ifbBytes, shareL2)
			// Without TCX all of the parent's ingress takes the
			// IFB (act_mirred), the node's own included.
			if float64(ifbBytes) > 1.1*shareL2+100_000 && !nettest.LacksTCX(t) {
				t.Errorf("the IFB carried %d bytes, more than the share's %.0f: other traffic (the node's %.0f Mbit/s, the neighbour's) took it",
					ifbBytes, shareL2, nodeBits)
			}
		}
	}
}

// The address entries of a share told apart by address: one per address on
// its parent; an address another share of the parent holds is refused and
// left to it; unprepare without a record (a crash) removes them all, twice
// over; and an ipvlan bandwidth share without any address is refused before
// anything is made (this needs no ipvlan in the kernel).
func TestAddressKeyedShareEntries(t *testing.T) {
	b := newBench(t)
	netdev.KeyByAddress(b.p)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	addrsOf := func(mac string) []string {
		t.Helper()
		all, err := b.shaper.ShareAddrs()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range all {
			if a.MAC == mac {
				if a.Parent != parent.Attrs().Index {
					t.Errorf("address %s of %s recorded for ifindex %d, not the parent's %d", a.Addr, mac, a.Parent, parent.Attrs().Index)
				}
				out = append(out, a.Addr.String())
			}
		}
		return out
	}
	cfg := &v1alpha1.NetworkConfig{Addresses: []string{"10.77.0.50/24", "fd77::50/64"}}
	one := b.alloc("one", "10M", "10M")
	spec := b.prepareSpec(one, cfg)
	if got := addrsOf(spec.MAC); len(got) != 2 {
		t.Fatalf("address entries %v, want 10.77.0.50 and fd77::50", got)
	}

	two := b.alloc("two", "10M", "")
	two.Config = mustConfig(t, cfg)
	_, err := b.p.Prepare(context.Background(), two, b.dev)
	if err == nil || !errors.Is(err, bpf.ErrAddrTaken) {
		t.Errorf("a second share with the same addresses: %v, want refused with ErrAddrTaken", err)
	}
	if got := addrsOf(netdev.ShareMAC(two.ShareKey()).String()); len(got) != 0 {
		t.Errorf("the refused share left address entries %v", got)
	}
	if got := addrsOf(spec.MAC); len(got) != 2 {
		t.Errorf("the first share's address entries after the refusal: %v", got)
	}

	for range 2 { // no record: what a crash before Prepare returned leaves
		if err := b.p.Unprepare(context.Background(), one, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := addrsOf(spec.MAC); len(got) != 0 {
		t.Errorf("after unprepare without a record: address entries %v left", got)
	}
	if shares, _ := b.shaper.Shares(); len(shares) != 0 {
		t.Errorf("after unprepare: share entries %v left", shares)
	}

	bare := b.alloc("bare", "10M", "")
	bare.Config = mustConfig(t, &v1alpha1.NetworkConfig{Mode: "ipvlan"})
	_, err = b.p.Prepare(context.Background(), bare, b.dev)
	if err == nil || !strings.Contains(err.Error(), "needs an address") {
		t.Errorf("an ipvlan bandwidth share without an address: %v, want refused", err)
	}
	if _, err := node.LinkByName(netdev.LinkName(bare.ShareKey())); err == nil {
		t.Error("the refused ipvlan share's interface was made")
	}
}

func mustConfig(t *testing.T, cfg *v1alpha1.NetworkConfig) []byte {
	t.Helper()
	raw, err := json.Marshal(prepare.EffectiveConfig{Network: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A pool bound to another parent or VLAN is refused to a share before
// anything is made, and the error names both.
func TestPoolBoundElsewhereIsRefused(t *testing.T) {
	b := newBench(t)
	p := b.preparerFrom("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n"+
		"  - {name: other-nic, cidr: 10.78.0.0/24, parent: nic9}\n"+
		"  - {name: tagged, cidr: 10.79.0.0/24, parent: "+b.tp.Parent+", vlan: 100}\n"+
		"  - {name: here, cidr: "+b.tp.Subnet+", parent: "+b.tp.Parent+"}\n", "boot-test")
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	before, _ := node.LinkList()
	for pool, want := range map[string]string{
		"other-nic": `address pool "other-nic" is bound to parent nic9 VLAN 0, and this share is on parent ` + b.tp.Parent + ` VLAN 0`,
		"tagged":    `address pool "tagged" is bound to parent ` + b.tp.Parent + ` VLAN 100, and this share is on parent ` + b.tp.Parent + ` VLAN 0`,
	} {
		a := b.alloc("pool-"+pool, "", "")
		a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Pools: []string{pool}}})
		if _, err := p.Prepare(context.Background(), a, b.dev); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("pool %s: %v; want %q", pool, err, want)
		}
	}
	if after, _ := node.LinkList(); len(after) != len(before) {
		t.Errorf("refused shares left links behind: %d links, then %d", len(before), len(after))
	}
	a := b.alloc("pool-here", "", "")
	a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Pools: []string{"here"}}})
	prepared, err := p.Prepare(context.Background(), a, b.dev)
	if err != nil {
		t.Fatalf("a pool of the share's parent: %v", err)
	}
	if err := p.Unprepare(context.Background(), a, prepared.Undo); err != nil {
		t.Fatal(err)
	}
}

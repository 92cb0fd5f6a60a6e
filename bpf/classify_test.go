package bpf

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// htbClass adds leaf class 1:minor with rate bits/s. netlink's
// HtbClassAttrs.Rate and Ceil are bits/s (NewHtbClass divides by 8) and
// Buffer/Cbuffer are bytes (it converts them to ticks). A buffer of about
// rate × 8 ms holds 0.95 of the rate at 1G too; netlink's default (rate/HZ
// + MTU) falls short there. An explicit quantum avoids the kernel's
// "quantum is big" warning.
func htbClass(t testing.TB, h *netlink.Handle, l netlink.Link, minor uint16, rate uint64) {
	t.Helper()
	buf := uint32(rate / 8 * 8 / 1000)
	c := netlink.NewHtbClass(netlink.ClassAttrs{
		LinkIndex: l.Attrs().Index,
		Parent:    netlink.MakeHandle(1, 0),
		Handle:    netlink.MakeHandle(1, minor),
	}, netlink.HtbClassAttrs{Rate: rate, Ceil: rate, Buffer: buf, Cbuffer: buf, Quantum: 60000})
	if err := h.ClassAdd(c); err != nil {
		t.Fatalf("HTB class 1:%x: %v", minor, err)
	}
}

// TestClassifyHTB: two shares (macvlans of the parent "a", each in its own
// client netns) send TCP to "b" at once; classify_egress on a puts each in
// its own HTB class, and each gets its class's rate.
func TestClassifyHTB(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	rates := []uint64{50e6, 200e6}
	n := newShareNet(t, len(rates))
	htb := netlink.NewHtb(netlink.QdiscAttrs{
		LinkIndex: n.a.Attrs().Index,
		Handle:    netlink.MakeHandle(1, 0),
		Parent:    netlink.HANDLE_ROOT,
	})
	htb.Defcls = 0 // unclassified (ARP) goes straight through
	nettest.SkipIfLacks(t, n.hh.QdiscAdd(htb), nettest.Qdisc("htb"))
	for i, r := range rates {
		htbClass(t, n.hh, n.a, uint16(0x10*(i+1)), r)
	}

	s := openShaper(t, dir)
	defer s.Close()
	for i, mac := range n.macs {
		if err := s.SetShare(Egress, mac, netlink.MakeHandle(1, uint16(0x10*(i+1)))); err != nil {
			t.Fatal(err)
		}
	}
	// TCX where the kernel has it, cls_bpf before 6.6: either must hold
	// each share to its rate (make vmtest runs this on 6.1).
	if err := inNS(n.host, func() error { return s.Attach(n.a.Attrs().Index, Egress) }); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := inNS(n.host, func() error { return s.Detach(n.a.Attrs().Index) }); err != nil {
			t.Error(err)
		}
	}()

	got := measure(t, n.srv, n.clients, "10.77.0.1", 500*time.Millisecond, 2*time.Second)

	stats, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rates {
		ratio := got[i] / float64(r)
		c := stats[Key{MAC: n.macs[i].String(), Dir: Egress}]
		t.Logf("share %s class 1:%x: %.1f Mbit/s goodput at %d Mbit/s, ratio %.3f; counted %d bytes in %d packets",
			n.macs[i], 0x10*(i+1), got[i]/1e6, r/1e6, ratio, c.Bytes, c.Packets)
		if lo, hi := nettest.GoodputBand(0.95*0.9, 0.95*1.1); ratio < lo || ratio > hi {
			t.Errorf("share %d: goodput/rate %.3f, want %.3f–%.3f", i, ratio, lo, hi)
		}
		if c.Bytes == 0 || c.Packets == 0 {
			t.Errorf("share %d: no bytes counted", i)
		}
	}
}

// shareNet is a parent NIC "a" in netns host, its peer "b" (10.77.0.1) in
// netns srv, and one macvlan share of "a" per client netns (10.77.0.11, .12
// ...), in bridge mode as carve creates them.
type shareNet struct {
	host, srv netns.NsHandle
	hh        *netlink.Handle // in host
	a         netlink.Link
	clients   []netns.NsHandle
	macs      []net.HardwareAddr
}

func newShareNet(t testing.TB, shares int) *shareNet {
	t.Helper()
	n := &shareNet{}
	n.host, _ = newNS(t)
	n.srv, _ = newNS(t)
	n.hh = nlHandle(t, n.host)
	hs := nlHandle(t, n.srv)
	n.a = addVeth(t, n.hh, "a", "b", n.srv)
	b, err := hs.LinkByName("b")
	if err != nil {
		t.Fatal(err)
	}
	addAddr(t, hs, b, "10.77.0.1/24")
	for i := range shares {
		ns, _ := newNS(t)
		hc := nlHandle(t, ns)
		la := netlink.NewLinkAttrs()
		la.Name = "m"
		la.ParentIndex = n.a.Attrs().Index
		la.Namespace = netlink.NsFd(ns)
		// Created from the host netns, where "a" is, straight into the client's.
		err := n.hh.LinkAdd(&netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE})
		nettest.SkipIfLacks(t, err, nettest.LinkKind("macvlan"))
		m, err := hc.LinkByName("m")
		if err != nil {
			t.Fatal(err)
		}
		addAddr(t, hc, m, fmt.Sprintf("10.77.0.%d/24", 11+i))
		n.clients = append(n.clients, ns)
		n.macs = append(n.macs, m.Attrs().HardwareAddr)
	}
	return n
}
func addAddr(t testing.TB, h *netlink.Handle, l netlink.Link, cidr string) {
	t.Helper()
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

// measure runs one TCP stream from each client netns to host (a port
// each), served in srv, and returns each stream's goodput in bits/s over
// window, after warmup. nettest.RunFlows counts what the receiver's kernel
// took in (TCP_INFO), not what a goroutine has read: the 6.12 guest of make
// vmtest once read 1.031 of a 50M class's rate when the reader had fallen
// behind at the window's start and caught up inside it.
func measure(t testing.TB, srv netns.NsHandle, clients []netns.NsHandle, host string, warmup, window time.Duration) []float64 {
	t.Helper()
	flows := make([]nettest.Flow, len(clients))
	for i, ns := range clients {
		flows[i] = nettest.Flow{From: ns, To: srv, ToAddr: net.JoinHostPort(host, strconv.Itoa(5201+i))}
	}
	res, err := nettest.RunFlows(flows, warmup, window, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(res))
	for i, r := range res {
		out[i] = r.Goodput()
	}
	return out
}

package bpf

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// passProg is what a CNI's TCX program ending in TCX_PASS looks like (Cilium
// returns it): it ends the TCX chain, so a program attached after it never
// sees the packet.
func passProg(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, // TCX_PASS
		License:      "MIT",
	})
	if err != nil {
		t.Fatalf("load a TCX_PASS program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestAttachAheadOfPassingProgram: a CNI program that returns TCX_PASS is
// on the parent's egress first; the classifier still sees every frame,
// because it is attached at the head of the chain and returns TCX_NEXT.
func TestAttachAheadOfPassingProgram(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	n := newShareNet(t, 0)
	addAddr(t, n.hh, n.a, "10.77.0.2/24")
	pass := passProg(t)
	var cni link.Link
	err := inNS(n.host, func() (err error) {
		cni, err = link.AttachTCX(link.TCXOptions{Interface: n.a.Attrs().Index, Program: pass, Attach: ebpf.AttachTCXEgress})
		return err
	})
	nettest.SkipIfLacks(t, err, nettest.BPF("TCX"))
	defer cni.Close()

	s := openShaper(t, dir)
	defer s.Close()
	mac := n.a.Attrs().HardwareAddr
	if err := s.SetShare(Egress, mac, netlink.MakeHandle(1, 0x10)); err != nil {
		t.Fatal(err)
	}
	attach(t, s, n.host, n.a.Attrs().Index, Egress)
	defer func() {
		if err := inNS(n.host, func() error { return s.Detach(n.a.Attrs().Index) }); err != nil {
			t.Error(err)
		}
	}()

	err = inNS(n.host, func() error {
		if r, err := link.QueryPrograms(link.QueryOptions{Target: n.a.Attrs().Index, Attach: ebpf.AttachTCXEgress}); err == nil {
			t.Logf("TCX egress programs, first to last: %+v", r.Programs)
		}
		c, err := net.ListenPacket("udp", ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 9}
		for range 10 {
			if _, err := c.WriteTo([]byte("carve"), to); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if c := st[Key{MAC: mac.String(), Dir: Egress}]; c.Packets < 10 {
		t.Errorf("classifier counted %d packets of the 10+ sent: it runs after the CNI's TCX_PASS program", c.Packets)
	}
	// The CNI's program still runs after ours (we return TCX_NEXT).
	info, err := cni.Info()
	if err != nil || info.TCX() == nil || info.TCX().Ifindex != uint32(n.a.Attrs().Index) {
		t.Errorf("the CNI's link was disturbed: %+v, %v", info, err)
	}
}

// TestReattachRetakesHead: a program put ahead of the classifier after it
// was attached (or a link an older carve attached at the tail) is passed
// again on the next Attach, as the agent does at every prepare.
func TestReattachRetakesHead(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	a := addVeth(t, h, "a", "b", netns.None())
	s := openShaper(t, dir)
	defer s.Close()
	attach(t, s, ns, a.Attrs().Index, Egress)
	pass := passProg(t)
	first := func() (id ebpf.ProgramID, err error) {
		err = inNS(ns, func() error {
			r, err := link.QueryPrograms(link.QueryOptions{Target: a.Attrs().Index, Attach: ebpf.AttachTCXEgress})
			if err == nil {
				id = r.Programs[0].ID
			}
			return err
		})
		return id, err
	}
	err := inNS(ns, func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: a.Attrs().Index, Program: pass, Attach: ebpf.AttachTCXEgress, Anchor: link.Head()})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	attach(t, s, ns, a.Attrs().Index, Egress)
	info, _ := s.objs.ClassifyEgress.Info()
	want, _ := info.ID()
	if got, err := first(); err != nil || got != want {
		t.Fatalf("first program on egress is %d (%v), want the classifier %d", got, err, want)
	}
	if paths, _ := filepath.Glob(filepath.Join(dir, "classify_egress-*")); len(paths) != 1 {
		t.Fatalf("pins: %v", paths)
	}
	if err := inNS(ns, func() error { return s.Detach(a.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	if got, _ := first(); got == want {
		t.Errorf("classifier still attached after Detach")
	}
}

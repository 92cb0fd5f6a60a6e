// Package nettest builds the network topology netdev's tests and
// benchmarks run on, entirely inside namespaces they create: a "node"
// namespace whose veth stands in for the physical NIC, a "server" namespace
// on its other end, and pod namespaces. Traffic never leaves them.
package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Topology is a node namespace with a parent NIC (a veth) whose peer is in a
// server namespace.
type Topology struct {
	t        testing.TB
	prefix   string
	Node     netns.NsHandle
	Server   netns.NsHandle
	Parent   string // the parent NIC's name in Node
	ServerIP string // the server end's address, in Subnet
	Subnet   string
	names    []string
}

// RequireRoot skips where the test cannot create namespaces (fails, where
// Required).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipUnlessRequired(t, "needs root to create network namespaces")
	}
}

// New creates the topology; everything is removed when the test ends.
func New(t testing.TB) *Topology {
	t.Helper()
	RequireRoot(t)
	b := make([]byte, 3)
	rand.Read(b)
	tp := &Topology{t: t, prefix: "cvt" + hex.EncodeToString(b), Parent: "nic0", ServerIP: "10.77.0.1", Subnet: "10.77.0.0/24"}
	t.Cleanup(tp.cleanup)
	tp.Node = tp.newNS("node")
	tp.Server = tp.newNS("srv")
	node, err := netlink.NewHandleAt(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	la := netlink.NewLinkAttrs()
	la.Name = tp.Parent
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "peer0"}); err != nil {
		t.Fatalf("veth: %v", err)
	}
	peer, _ := node.LinkByName("peer0")
	if err := node.LinkSetNsFd(peer, int(tp.Server)); err != nil {
		t.Fatal(err)
	}
	parent, _ := node.LinkByName(tp.Parent)
	if err := node.LinkSetUp(parent); err != nil {
		t.Fatal(err)
	}
	srv, err := netlink.NewHandleAt(tp.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, _ = srv.LinkByName("peer0")
	addr, _ := netlink.ParseAddr(tp.ServerIP + "/24")
	if err := srv.AddrAdd(peer, addr); err != nil {
		t.Fatal(err)
	}
	if err := srv.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	lo, _ := srv.LinkByName("lo")
	_ = srv.LinkSetUp(lo)
	return tp
}

// NewPod creates a pod network namespace.
func (tp *Topology) NewPod(name string) netns.NsHandle {
	tp.t.Helper()
	ns := tp.newNS(name)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tp.t.Fatal(err)
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	_ = h.LinkSetUp(lo)
	return ns
}

func (tp *Topology) newNS(suffix string) netns.NsHandle {
	tp.t.Helper()
	name := tp.prefix + suffix
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tp.t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	_ = netns.Set(orig)
	if err != nil {
		tp.t.Fatalf("netns %s: %v", name, err)
	}
	tp.names = append(tp.names, name)
	return ns
}

func (tp *Topology) cleanup() {
	for _, ns := range []netns.NsHandle{tp.Node, tp.Server} {
		if ns.IsOpen() {
			ns.Close()
		}
	}
	for _, n := range tp.names {
		_ = netns.DeleteNamed(n)
	}
}

// Path is the bind-mount path of a namespace made here.
func (tp *Topology) Path(suffix string) string { return "/var/run/netns/" + tp.prefix + suffix }

// Exec runs a command inside a namespace made here (ip netns exec).
func (tp *Topology) Exec(suffix string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", tp.prefix + suffix}, args...)...)
}

// In runs fn with the goroutine's thread in ns. Where the thread cannot
// go back, it stays locked to the goroutine, so that no other goroutine is
// scheduled on it, and ends with it.
func In(ns netns.NsHandle, fn func() error) (err error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer func() {
		if serr := netns.Set(orig); serr != nil {
			err = errors.Join(err, fmt.Errorf("back to the original network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// Listen opens a TCP listener inside ns; the socket stays in ns.
func Listen(ns netns.NsHandle, addr string) (net.Listener, error) {
	var l net.Listener
	err := In(ns, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return l, nil
}

// Dial connects from inside ns.
func Dial(ns netns.NsHandle, addr string) (net.Conn, error) {
	var c net.Conn
	err := In(ns, func() (err error) {
		c, err = net.Dial("tcp", addr)
		return err
	})
	return c, err
}

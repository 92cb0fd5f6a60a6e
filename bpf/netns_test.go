package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// needRoot skips tests that need CAP_NET_ADMIN, CAP_BPF and CAP_SYS_ADMIN
// (fails them, where CARVE_NET_REQUIRED=1).
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		nettest.SkipUnlessRequired(t, "needs root: creates netns, loads BPF, mounts bpffs")
	}
	// Kernels since 5.11 account BPF memory to the cgroup; older ones need
	// the memlock rlimit raised. Harmless where it is not needed.
	_ = rlimit.RemoveMemlock()
}

// testPinDir is a fresh directory on bpffs, removed with its pins at the end.
func testPinDir(t testing.TB) string {
	t.Helper()
	nettest.NeedBPFFS(t, MountBPFFS(""))
	// The process id too: fuzz workers are processes of one test, whose
	// temporary directories have the same base names.
	dir := filepath.Join(DefaultBPFFS, fmt.Sprintf("carve-test-%d-%s", os.Getpid(), filepath.Base(t.TempDir())))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newNS creates an unnamed netns. del closes it (so the kernel deletes it
// once nothing else holds it); it runs at cleanup too, and only once. The
// calling goroutine's netns is unchanged.
func newNS(t testing.TB) (ns netns.NsHandle, del func()) {
	t.Helper()
	err := inNS(netns.None(), func() error {
		var err error
		ns, err = netns.New() // moves this thread; inNS moves it back
		return err
	})
	if err != nil {
		t.Fatalf("new netns: %v", err)
	}
	var once sync.Once
	del = func() { once.Do(func() { ns.Close() }) }
	t.Cleanup(del)
	return ns, del
}

// inNS runs f on a thread in ns (netns.None(): the current one, for f to
// switch).
// If the thread cannot be moved back it stays locked, so Go discards it.
func inNS(ns netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if ns.IsOpen() {
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			return err
		}
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// nlHandle is a netlink handle working in ns, closed at cleanup.
func nlHandle(t testing.TB, ns netns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// addVeth creates name<->peer in h's netns, the peer created in peerNS when
// that is open, and returns the local end, up.
func addVeth(t testing.TB, h *netlink.Handle, name, peer string, peerNS netns.NsHandle) netlink.Link {
	t.Helper()
	la := netlink.NewLinkAttrs() // zero TxQLen would set txqueuelen 0
	la.Name = name
	v := &netlink.Veth{LinkAttrs: la, PeerName: peer, PeerTxQLen: -1}
	if peerNS.IsOpen() {
		v.PeerNamespace = netlink.NsFd(peerNS)
	}
	nettest.SkipIfLacks(t, h.LinkAdd(v), nettest.LinkKind("veth"))
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return l
}

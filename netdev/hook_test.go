package netdev_test

import (
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
)

// A pod in the node's own namespace (hostNetwork) is refused: the share's
// addresses and routes would land on the node.
func TestHookRefusesTheNodesNamespace(t *testing.T) {
	b := newBench(t)
	s := b.add("hostnet", "", "", &v1alpha1.NetworkConfig{Pools: []string{"test"}, InterfaceName: "share0"})
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	before, _ := node.RouteList(nil, netlink.FAMILY_ALL)
	err := hook.AttachToPod(b.tp.Node, b.tp.Node, s.spec)
	if err == nil || !strings.Contains(err.Error(), "hostNetwork") {
		t.Fatalf("attach into the node's namespace: %v; want a refusal naming hostNetwork", err)
	}
	if after, _ := node.RouteList(nil, netlink.FAMILY_ALL); len(after) != len(before) {
		t.Errorf("the node's routes changed: %d, then %d", len(before), len(after))
	}
}

// An interface of the pod's that only has the share's name (the CNI's) is
// never configured as the share.
func TestHookChecksTheInterfaceIsTheShares(t *testing.T) {
	b := newBench(t)
	a := b.alloc("impostor", "", "")
	spec := b.prepareSpec(a, &v1alpha1.NetworkConfig{Pools: []string{"test"}, InterfaceName: "eth9"})
	pod := b.tp.NewPod("impostor")
	h, _ := netlink.NewHandleAt(pod)
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "eth9"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth9peer"}); err != nil {
		t.Fatal(err)
	}
	err := hook.AttachToPod(b.tp.Node, pod, spec)
	if err == nil || !strings.Contains(err.Error(), "not carve's share") {
		t.Fatalf("attach over the pod's own eth9: %v; want a refusal", err)
	}
	eth9, _ := h.LinkByName("eth9")
	if addrs, _ := h.AddrList(eth9, netlink.FAMILY_V4); len(addrs) != 0 {
		t.Errorf("the pod's eth9 got the share's addresses: %v", addrs)
	}
}

// A pod sandbox that is recreated takes the share's interface away with its
// old namespace; the hook of the new sandbox's containers makes it again,
// with the share's MAC, and configures it.
func TestHookRemakesTheInterfaceForARecreatedSandbox(t *testing.T) {
	b := newBench(t)
	s := b.add("resandbox", "", "", &v1alpha1.NetworkConfig{Pools: []string{"test"}})
	// The old sandbox goes, and its namespace with it.
	s.pod.Close()
	if err := netns.DeleteNamed(strings.TrimPrefix(b.tp.Path("resandbox"), "/var/run/netns/")); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	time.Sleep(100 * time.Millisecond)
	pod := b.tp.NewPod("resandbox2")
	if err := hook.AttachToPod(b.tp.Node, pod, s.spec); err != nil {
		t.Fatalf("attach to the recreated sandbox: %v", err)
	}
	h, _ := netlink.NewHandleAt(pod)
	defer h.Close()
	link, err := h.LinkByName(s.spec.PodName)
	if err != nil {
		t.Fatalf("no %s in the new sandbox: %v", s.spec.PodName, err)
	}
	if !strings.EqualFold(link.Attrs().HardwareAddr.String(), s.spec.MAC) || link.Attrs().OperState == netlink.OperDown {
		t.Errorf("remade interface: MAC %s (want %s), state %s", link.Attrs().HardwareAddr, s.spec.MAC, link.Attrs().OperState)
	}
	if addrs, _ := h.AddrList(link, netlink.FAMILY_V4); len(addrs) != 1 {
		t.Errorf("remade interface's addresses: %v", addrs)
	}
}

// The agent's prepare makes no interface on the node; the hook makes it in
// the pod, under its pod name, with the share's MAC, MTU, GSO limit and
// carve's alias, where a move into the pod would wait for RCU grace periods.
// One an older agent made on the node is moved in instead, and one the hook
// made before it was killed, still without its alias, is taken for the
// share's by its lower device on the node.
func TestHookMakesTheInterfaceInThePod(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	a := b.alloc("made", "100M", "100M")
	spec := b.prepareSpec(a, &v1alpha1.NetworkConfig{Pools: []string{"test"}})
	if _, err := node.LinkByName(spec.HostName); err == nil {
		t.Fatalf("prepare made %s on the node", spec.HostName)
	}
	pod := b.tp.NewPod("made")
	if err := hook.AttachToPod(b.tp.Node, pod, spec); err != nil {
		t.Fatal(err)
	}
	h, _ := netlink.NewHandleAt(pod)
	defer h.Close()
	link, err := h.LinkByName(spec.PodName)
	if err != nil {
		t.Fatalf("no %s in the pod: %v", spec.PodName, err)
	}
	if link.Type() != "macvlan" || link.Attrs().Alias != hook.AliasOf(spec.HostName) || !strings.EqualFold(link.Attrs().HardwareAddr.String(), spec.MAC) ||
		link.Attrs().MTU != spec.MTU || int(link.Attrs().GSOMaxSegs) != spec.GSOMaxSegs || link.Attrs().OperState == netlink.OperDown {
		t.Errorf("the pod's %s: %s, alias %q, MAC %s, MTU %d, GSO %d segments, %s; want macvlan, %q, %s, %d, %d, up",
			spec.PodName, link.Type(), link.Attrs().Alias, link.Attrs().HardwareAddr, link.Attrs().MTU, link.Attrs().GSOMaxSegs, link.Attrs().OperState,
			hook.AliasOf(spec.HostName), spec.MAC, spec.MTU, spec.GSOMaxSegs)
	}

	// Killed between making it and naming it carve's: the next container's
	// hook takes it, and names it.
	if err := h.LinkSetAlias(link, ""); err != nil {
		t.Fatal(err)
	}
	if err := hook.AttachToPod(b.tp.Node, pod, spec); err != nil {
		t.Fatalf("the next container, the alias missing: %v", err)
	}
	if l, _ := h.LinkByName(spec.PodName); l == nil || l.Attrs().Alias != hook.AliasOf(spec.HostName) {
		t.Errorf("the interface made before a kill is not named carve's again: %+v", l)
	}

	// An older agent's share: its interface on the node, moved in.
	old := b.alloc("older", "", "")
	oldSpec := b.prepareSpec(old, &v1alpha1.NetworkConfig{Pools: []string{"test"}})
	parent, err := node.LinkByName(oldSpec.Parent)
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(oldSpec.MAC)
	if err := hook.AddChild(node, parent, oldSpec.Mode, oldSpec.HostName, mac, oldSpec.MTU); err != nil {
		t.Fatal(err)
	}
	oldPod := b.tp.NewPod("older")
	if err := hook.AttachToPod(b.tp.Node, oldPod, oldSpec); err != nil {
		t.Fatal(err)
	}
	if _, err := node.LinkByName(oldSpec.HostName); err == nil {
		t.Errorf("the older agent's %s is still on the node", oldSpec.HostName)
	}
	oh, _ := netlink.NewHandleAt(oldPod)
	defer oh.Close()
	if l, err := oh.LinkByName(oldSpec.PodName); err != nil || !strings.EqualFold(l.Attrs().HardwareAddr.String(), oldSpec.MAC) {
		t.Errorf("the older agent's interface in its pod: %v, %v", l, err)
	}
}

package hook

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunAttach is the whole createRuntime hook: it reads the attach spec
// and the OCI state on stdin, and attaches the share to the container's
// pod, giving up after the hook's time bound so that a stuck netlink call
// never holds a pod's start forever. The pod's network namespace is the
// one the container's bundle names (the sandbox's, by path), and the
// container's process must be in it: a pid alone could name any process
// by the time the hook reads /proc.
func RunAttach(specFile, root string, ociState io.Reader) error {
	spec, err := ReadAttachSpec(specFile)
	if err != nil {
		return err
	}
	state, err := readState(ociState)
	if err != nil {
		return err
	}
	bundle, err := ReadBundle(root, state.Bundle)
	if err != nil {
		return err
	}
	sandbox := bundle.Netns()
	if !spec.AllowNetAdmin {
		capName, err := bundle.NetAdmin()
		if err != nil {
			return err
		}
		if capName != "" {
			return fmt.Errorf("container %s has %s, which lets it change or get around its NIC share %s (its MAC and addresses, links nested on it): "+
				"its DeviceClass does not allow it (NetworkConfig allowNetAdmin: true, the admin's)", state.ID, capName, spec.PodName)
		}
	}
	pid := state.Pid
	done := make(chan error, 1)
	go func() { done <- attachPID(root, pid, sandbox, spec) }()
	select {
	case err := <-done:
		return err
	case <-time.After((TimeoutSeconds - 2) * time.Second):
		return fmt.Errorf("attaching %s to the pod of pid %d took longer than %ds", spec.HostName, pid, TimeoutSeconds-2)
	}
}

func attachPID(root string, pid int, sandbox string, spec AttachSpec) error {
	podNS, err := PodNetnsOf(root, pid)
	if err != nil {
		return err
	}
	defer podNS.Close()
	if sandbox != "" {
		sandboxNS, err := netns.GetFromPath(filepath.Join(root, sandbox))
		if err != nil {
			return fmt.Errorf("the pod sandbox's network namespace %s: %w", sandbox, err)
		}
		defer sandboxNS.Close()
		if same, err := sameNetns(podNS, sandboxNS); err != nil {
			return err
		} else if !same {
			return fmt.Errorf("pid %d is not in the pod sandbox's network namespace %s: refusing to attach %s to it", pid, sandbox, spec.HostName)
		}
	}
	// The runtime runs hooks in its own (the node's) namespace.
	hostNS, err := netns.Get()
	if err != nil {
		return err
	}
	defer hostNS.Close()
	if err := AttachToPod(hostNS, podNS, spec); err != nil {
		return err
	}
	return RecordPodNetns(hostNS, podNS, spec)
}

// sameNetns reports whether two handles are one namespace.
func sameNetns(a, b netns.NsHandle) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a), &sa); err != nil {
		return false, fmt.Errorf("node network namespace: %w", err)
	}
	if err := unix.Fstat(int(b), &sb); err != nil {
		return false, fmt.Errorf("pod network namespace: %w", err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// checkIdentity makes sure the pod's interface of the share's name is the
// share's: carve's alias, or (an interface made before aliases) a macvlan
// with the share's MAC.
func checkIdentity(link netlink.Link, spec AttachSpec) error {
	if link.Attrs().Alias == AliasOf(spec.HostName) {
		return nil
	}
	if mac, err := net.ParseMAC(spec.MAC); err == nil && link.Attrs().Alias == "" && link.Type() == "macvlan" &&
		strings.EqualFold(link.Attrs().HardwareAddr.String(), mac.String()) {
		return nil
	}
	return fmt.Errorf("the pod's interface %s is not carve's share %s (a %s with MAC %s, alias %q): another network owns that name; set another interfaceName",
		spec.PodName, spec.HostName, link.Type(), link.Attrs().HardwareAddr, link.Attrs().Alias)
}

// createdInPod says whether the hook makes the share's interface in the
// pod (createInPod) rather than moves it there (bringIntoPod): where it is
// neither on the node nor in the pod under its node name. This agent's prepare makes none there, since a move
// into a namespace waits for RCU grace periods (24 ms p50 on this
// project's machines) where making it there takes 0.5 ms; an older
// agent's prepare did, and a hook killed between the move and the rename
// left one in the pod under its node name.
func createdInPod(host, pod *netlink.Handle, spec AttachSpec) bool {
	if _, err := pod.LinkByName(spec.HostName); err == nil {
		return false
	}
	_, err := host.LinkByName(spec.HostName)
	return err != nil
}

// madeWithoutAlias says whether link, the pod's interface of the share's
// pod name without carve's alias, is one createInPod made before it was
// killed, and then gives it the alias: of the share's kind, its lower
// device in another namespace (a process of the pod can make neither) at
// the index of the share's lower device on the node.
func madeWithoutAlias(host, pod *netlink.Handle, link netlink.Link, spec AttachSpec) bool {
	if link.Attrs().Alias != "" || link.Type() != spec.Kind || link.Attrs().NetNsID < 0 {
		return false
	}
	lower, err := lowerOf(host, spec)
	if err != nil || link.Attrs().ParentIndex != lower.Attrs().Index {
		return false
	}
	return pod.LinkSetAlias(link, AliasOf(spec.HostName)) == nil
}

// bringIntoPod finds the share's interface in the pod under its node name
// (a hook killed between move and rename), or on the node, and moves it
// into the pod (an interface an older agent's prepare made there).
func bringIntoPod(host, pod *netlink.Handle, podNS netns.NsHandle, spec AttachSpec) (netlink.Link, error) {
	if link, err := pod.LinkByName(spec.HostName); err == nil {
		return link, checkIdentity(link, AttachSpec{HostName: spec.HostName, PodName: spec.HostName, MAC: spec.MAC})
	}
	onHost, err := host.LinkByName(spec.HostName)
	if err != nil {
		return nil, fmt.Errorf("find %s on the node: %w", spec.HostName, err)
	}
	if err := host.LinkSetNsFd(onHost, int(podNS)); err != nil {
		return nil, fmt.Errorf("move %s into the pod: %w", spec.HostName, err)
	}
	link, err := pod.LinkByName(spec.HostName)
	if err != nil {
		return nil, fmt.Errorf("find %s in the pod: %w", spec.HostName, err)
	}
	return link, nil
}

// lowerOf is the node's device the share's interface hangs from: its parent,
// or the parent's VLAN device.
func lowerOf(host *netlink.Handle, spec AttachSpec) (netlink.Link, error) {
	parent, err := host.LinkByName(spec.Parent)
	if err != nil {
		return nil, fmt.Errorf("the parent %s of %s: %w", spec.Parent, spec.HostName, err)
	}
	if spec.VLAN == 0 {
		return parent, nil
	}
	name := fmt.Sprintf("cv%d.%d", parent.Attrs().Index, spec.VLAN)
	lower, err := host.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("the lower device %s of %s: %w", name, spec.HostName, err)
	}
	return lower, nil
}

// createInPod makes the share's interface in the pod's namespace under its
// pod name, from the spec: the MAC, mode and MTU the preparer chose, and
// carve's alias, which it can only set once the interface exists (a hook
// killed in between leaves one checkIdentity still knows by its lower).
func createInPod(host, pod *netlink.Handle, podNS netns.NsHandle, spec AttachSpec) (netlink.Link, error) {
	if spec.Parent == "" || spec.Kind == "" {
		return nil, fmt.Errorf("interface %s is neither on the node nor in the pod, and its attach spec is too old to make it", spec.HostName)
	}
	lower, err := lowerOf(host, spec)
	if err != nil {
		return nil, err
	}
	mac, _ := net.ParseMAC(spec.MAC)
	child, err := NewChild(lower, spec.Mode, spec.PodName, mac, spec.MTU)
	if err != nil {
		return nil, err
	}
	child.Attrs().Namespace = netlink.NsFd(int(podNS))
	child.Attrs().GSOMaxSegs = uint32(max(spec.GSOMaxSegs, 0))
	// An interface of the share's that an older sandbox of the pod took
	// away dies with its namespace asynchronously; until it is gone its
	// MAC is still taken on the parent.
	deadline := time.Now().Add(3 * time.Second)
	for {
		err = host.LinkAdd(child)
		if err == nil || !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s %s on %s in the pod: %w", spec.Kind, spec.PodName, lower.Attrs().Name, err)
	}
	link, err := pod.LinkByName(spec.PodName)
	if err != nil {
		return nil, fmt.Errorf("find %s in the pod: %w", spec.PodName, err)
	}
	if err := pod.LinkSetAlias(link, AliasOf(spec.HostName)); err != nil {
		return nil, fmt.Errorf("mark %s as carve's share %s: %w", spec.PodName, spec.HostName, err)
	}
	return link, nil
}

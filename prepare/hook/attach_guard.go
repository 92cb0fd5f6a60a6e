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
	sandbox, err := BundleNetns(root, state.Bundle)
	if err != nil {
		return err
	}
	if !spec.AllowNetAdmin {
		capName, err := BundleNetAdmin(root, state.Bundle)
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

// bringIntoPod finds the share's interface on the node (and moves it into
// the pod), or in the pod under its node name (a hook killed between move
// and rename), or makes it again on the node from the spec when it is in
// neither: a pod sandbox that was recreated took it away with its old
// namespace, and without it every container start would fail from then on.
func bringIntoPod(host, pod *netlink.Handle, podNS netns.NsHandle, spec AttachSpec) (netlink.Link, error) {
	if link, err := pod.LinkByName(spec.HostName); err == nil {
		return link, checkIdentity(link, AttachSpec{HostName: spec.HostName, PodName: spec.HostName, MAC: spec.MAC})
	}
	onHost, err := host.LinkByName(spec.HostName)
	if err != nil {
		if onHost, err = recreateOnHost(host, spec); err != nil {
			return nil, err
		}
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

// recreateOnHost makes the share's interface again on its parent, as the
// preparer made it: same name, MAC and mode, so the classifier's entries
// and the claim's status still describe it.
func recreateOnHost(host *netlink.Handle, spec AttachSpec) (netlink.Link, error) {
	if spec.Parent == "" || spec.Kind == "" {
		return nil, fmt.Errorf("interface %s is neither on the node nor in the pod, and its attach spec is too old to make it again", spec.HostName)
	}
	lowerName := spec.Parent
	parent, err := host.LinkByName(spec.Parent)
	if err != nil {
		return nil, fmt.Errorf("interface %s is gone and its parent %s too: %w", spec.HostName, spec.Parent, err)
	}
	if spec.VLAN != 0 {
		lowerName = fmt.Sprintf("cv%d.%d", parent.Attrs().Index, spec.VLAN)
	}
	lower, err := host.LinkByName(lowerName)
	if err != nil {
		return nil, fmt.Errorf("interface %s is gone and its lower device %s too: %w", spec.HostName, lowerName, err)
	}
	mac, _ := net.ParseMAC(spec.MAC)
	// The old interface dies with its namespace asynchronously; until it
	// is gone its MAC is still taken on the parent.
	deadline := time.Now().Add(3 * time.Second)
	for {
		err = AddChild(host, lower, spec.Mode, spec.HostName, mac, spec.MTU)
		if err == nil || errors.Is(err, unix.EEXIST) {
			return host.LinkByName(spec.HostName)
		}
		if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			return nil, fmt.Errorf("make %s again for a recreated pod sandbox: %w", spec.HostName, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package hook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/atomicfile"
)

// AttachSpec tells the hook how to hand a share's interface to a pod. It is
// also the share's record on the node, written before anything is created:
// it names the claim and share it belongs to and the boot it was made in, so
// that a share can be found and removed from kernel state and this file
// alone, even when the checkpoint has lost it.
type AttachSpec struct {
	// ClaimUID, Request, Device and ShareID identify the allocation.
	ClaimUID string `json:"claimUID,omitempty"`
	Request  string `json:"request,omitempty"`
	Device   string `json:"device,omitempty"`
	ShareID  string `json:"shareID,omitempty"`
	// BootID is the kernel boot the share was made in; after a reboot
	// nothing it describes exists.
	BootID string `json:"bootID,omitempty"`
	// HostName is the interface's name on the node.
	HostName string `json:"hostName"`
	// Parent is the NIC it was cut from; recorded before anything is
	// created, so that a crash halfway can still be undone.
	Parent string `json:"parent"`
	// Kind, Mode and VLAN say how the interface was made (macvlan or
	// ipvlan, its mode, the parent's VLAN), so that the hook can make it
	// again when a recreated pod sandbox took the first one away with its
	// old namespace.
	Kind string `json:"kind,omitempty"`
	Mode string `json:"mode,omitempty"`
	VLAN int    `json:"vlan,omitempty"`
	// PodName is its name in the pod.
	PodName string `json:"podName"`
	MTU     int    `json:"mtu"`
	// GSOMaxSegs, where set, bounds the interface's GSO super-packets to
	// about 4 ms of the share's egress rate: HTB lets a
	// super-packet out as one burst, which TCP reads as a faster path
	// (netdev/gso.go).
	GSOMaxSegs int `json:"gsoMaxSegs,omitempty"`
	// AllowNetAdmin lets a container with CAP_NET_ADMIN or CAP_SYS_ADMIN
	// take the share (the class's allowNetAdmin); without it the hook
	// refuses such a container, which then does not start.
	AllowNetAdmin bool     `json:"allowNetAdmin,omitempty"`
	MAC           string   `json:"mac"`
	Addresses     []string `json:"addresses,omitempty"`
	Routes        []Route  `json:"routes,omitempty"`
	// PodShare, where set, is recorded by the hook once the pod's
	// network namespace exists (RecordPodNetns).
	PodShare *PodShareSpec `json:"podShare,omitempty"`
}

// Route is a route the share's interface gets in the pod (the claim
// config's route, as the attach spec carries it).
type Route struct {
	// Destination in CIDR form; "default" for the default route.
	Destination string `json:"destination"`
	// Gateway, when set, is the next hop.
	Gateway string `json:"gateway,omitempty"`
}

// WriteAttachSpec writes the spec the hook reads; the preparer writes it
// before it creates anything.
func WriteAttachSpec(path string, spec AttachSpec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return atomicfile.Replace(path, b, 0o644)
}

// ReadAttachSpec reads the spec the preparer wrote.
func ReadAttachSpec(path string) (AttachSpec, error) {
	var spec AttachSpec
	b, err := os.ReadFile(path)
	if err != nil {
		return spec, fmt.Errorf("attach spec: %w", err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("attach spec %s: %w", path, err)
	}
	return spec, nil
}

// PodNetnsOf opens the network namespace of a container's process, under a
// host root (/ or /host).
func PodNetnsOf(root string, pid int) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath(filepath.Join(root, "proc", strconv.Itoa(pid), "ns", "net"))
	if err != nil {
		return netns.None(), fmt.Errorf("network namespace of pid %d: %w", pid, err)
	}
	return ns, nil
}

// AttachToPod moves the share's interface from the node's namespace into the
// pod's, names it, gives it its MTU, addresses and routes, and brings it up.
// Every container of a pod runs the hook, so it is idempotent: an interface
// already in the pod is only checked and completed. It refuses a pod in the
// node's own namespace (hostNetwork), and an interface of the pod's that
// only has the share's name; it makes the interface again where a
// recreated sandbox took the first one away with its old namespace.
func AttachToPod(hostNS, podNS netns.NsHandle, spec AttachSpec) error {
	if same, err := sameNetns(hostNS, podNS); err != nil {
		return err
	} else if same {
		return fmt.Errorf("the pod runs in the node's network namespace (hostNetwork): it cannot take the share %s, whose addresses and routes would land on the node", spec.HostName)
	}
	host, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return err
	}
	defer host.Close()
	pod, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return err
	}
	defer pod.Close()

	link, err := pod.LinkByName(spec.PodName)
	if err == nil {
		if !madeWithoutAlias(host, pod, link, spec) {
			if err := checkIdentity(link, spec); err != nil {
				return err
			}
		}
	} else if createdInPod(host, pod, spec) {
		// Made in the pod under its pod name (createInPod): nothing to
		// move or rename.
		if link, err = createInPod(host, pod, podNS, spec); err != nil {
			return err
		}
	} else {
		if link, err = bringIntoPod(host, pod, podNS, spec); err != nil {
			return err
		}
		if err := pod.LinkSetName(link, spec.PodName); err != nil {
			return fmt.Errorf("rename %s to %s: %w", spec.HostName, spec.PodName, err)
		}
	}
	// A share whose class lets its pods have CAP_NET_ADMIN gets its
	// programs as TCX links, which no process of the pod can detach; the
	// others as cls_bpf filters, which only such a process could delete
	// and which take no RCU grace period to attach (bpf.PodHook).
	how := bpf.PodHookFilter
	if spec.AllowNetAdmin {
		how = bpf.PodHookLink
	}
	if ps := spec.PodShare; ps != nil && ps.Guard {
		// Before the interface is up: no frame leaves unchecked.
		err := InNetns(podNS, func() error { return bpf.AttachPodGuard(ps.PinDir, spec.HostName, link.Attrs().Index, how) })
		if err != nil {
			return fmt.Errorf("the pod guard of %s: %w", spec.PodName, err)
		}
	}
	// The link-local address from the MAC (EUI-64): the only one the
	// policy lets the share claim (bpf/policy.h). An interface still down
	// makes its link-local address when it comes up.
	if err := pod.LinkSetIP6AddrGenMode(link, 0); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("set the IPv6 address generation of %s: %w", spec.PodName, err)
	}
	if spec.MTU > 0 && link.Attrs().MTU != spec.MTU {
		if err := pod.LinkSetMTU(link, spec.MTU); err != nil {
			return fmt.Errorf("set MTU of %s: %w", spec.PodName, err)
		}
	}
	if spec.GSOMaxSegs > 0 && link.Attrs().GSOMaxSegs != uint32(spec.GSOMaxSegs) {
		if err := pod.LinkSetGSOMaxSegs(link, spec.GSOMaxSegs); err != nil {
			return fmt.Errorf("set the GSO limit of %s: %w", spec.PodName, err)
		}
	}
	for _, a := range spec.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
		if pfx, _ := netip.ParsePrefix(a); pfx.Addr().Is6() {
			addr.Flags |= unix.IFA_F_NODAD // usable at once: the pod starts now
		}
		if err := pod.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, spec.PodName, err)
		}
	}
	if err := announceOnUp(podNS, spec.PodName); err != nil {
		return err
	}
	if err := setUpWhenFree(pod, link); err != nil {
		return fmt.Errorf("set %s up: %w", spec.PodName, err)
	}
	for _, r := range spec.Routes {
		route := &netlink.Route{LinkIndex: link.Attrs().Index}
		if r.Destination != "default" {
			_, dst, err := net.ParseCIDR(r.Destination)
			if err != nil {
				return fmt.Errorf("route %s: %w", r.Destination, err)
			}
			route.Dst = dst
		}
		if r.Gateway != "" {
			route.Gw = net.ParseIP(r.Gateway)
		}
		if err := pod.RouteReplace(route); err != nil {
			return fmt.Errorf("route %s via %s: %w", r.Destination, r.Gateway, err)
		}
	}
	if ps := spec.PodShare; ps != nil && ps.IngressAQM {
		err := InNetns(podNS, func() error { return bpf.AttachDequeued(ps.PinDir, link.Attrs().Index, how) })
		// An agent too old to pin the program made no AQM state
		// either: the share runs without.
		if err != nil && !errors.Is(err, bpf.ErrNoDequeuedProgram) {
			return fmt.Errorf("the ingress AQM of %s: %w", spec.PodName, err)
		}
	}
	return nil
}

// announceOnUp has the kernel send a gratuitous ARP for the interface's
// addresses when it comes up (arp_notify): a pool address is often one
// another share, maybe on another node, had a moment ago, and its
// neighbours' ARP entries would point at that share's MAC for seconds.
// Where the pod's namespace has no IPv4 (no such sysctl), nothing is sent.
func announceOnUp(podNS netns.NsHandle, ifName string) error {
	err := InNetns(podNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/"+ifName+"/arp_notify", []byte("1"), 0o600) // the mode is unused: a sysctl exists
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("announce the addresses of %s when it comes up: %w", ifName, err)
	}
	return nil
}

// macFreeWait bounds how long the hook waits for a dying interface to give
// up the share's MAC; well inside the hook's own time limit.
const macFreeWait = 5 * time.Second

// setUpWhenFree brings link up. A macvlan cannot come up while another on
// its parent has its MAC (EADDRINUSE): after a sandbox is recreated, the
// old interface goes with its namespace, which the kernel tears down in the
// background. It is waited for, not fought.
func setUpWhenFree(pod *netlink.Handle, link netlink.Link) error {
	deadline := time.Now().Add(macFreeWait)
	for {
		err := pod.LinkSetUp(link)
		if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

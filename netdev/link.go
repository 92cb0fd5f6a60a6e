package netdev

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
)

// checkChild is prepare's part of the share's interface, which the hook
// makes in the pod, under its pod name (hook.createInPod: a move into a
// namespace waits for RCU grace periods, 24 ms p50 on this project's
// machines, where making it there takes 0.5 ms). It refuses a name another
// parent's interface has, leaves one of the share's on the node (an older
// agent's prepare made it there, and the hook moves it), and asks the
// kernel once per kind whether it can make the share's kind at all, so that
// a kernel without ipvlan fails the prepare, naming it, not the container.
func (p *NICPreparer) checkChild(lower netlink.Link, cfg v1alpha1.NetworkConfig, name string, mac net.HardwareAddr, mtu int) error {
	if existing, err := p.h.LinkByName(name); err == nil {
		if existing.Attrs().ParentIndex != lower.Attrs().Index {
			return fmt.Errorf("interface %s exists on another parent", name)
		}
		return nil
	}
	mode := net1Mode(cfg)
	kind := hook.ChildKind(mode)
	p.childProbe.Lock() // one probe at a time: they share its name
	defer p.childProbe.Unlock()
	if known, asked := p.childKinds[kind]; asked {
		return known
	}
	// The other agent of a rolling update probes under the same name
	// (two agents' first prepares at once: "file exists" in CI).
	unlock, err := flockFile(filepath.Join(p.opts.StateDir, "netdev", ".lock-probe"), "the probe interface")
	if err != nil {
		return err
	}
	defer unlock()
	// A child of the kind on lower, down, gone at once: the one
	// deletion (an RCU grace period) this agent pays for it. One left by
	// an agent that died in between is removed first.
	probe := fmt.Sprintf("cvprobe%d", lower.Attrs().Index)
	if l, err := p.h.LinkByName(probe); err == nil {
		if err := p.h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("remove the stale probe interface %s: %w", probe, err)
		}
	}
	err = hook.AddChild(p.h, lower, mode, probe, probeMAC(mac), mtu)
	switch {
	case err == nil:
		if l, lerr := p.h.LinkByName(probe); lerr == nil {
			_ = p.h.LinkDel(l)
		}
	case errors.Is(err, unix.EOPNOTSUPP):
		// The kernel's answer to a kind it has no driver for.
		err = fmt.Errorf("this node's kernel cannot make %s interfaces: %w", kind, err)
	default:
		// Not an answer about the kind: asked again next time.
		return err
	}
	if p.childKinds == nil {
		p.childKinds = map[string]error{}
	}
	p.childKinds[kind] = err
	return err
}

// probeMAC is a MAC for the probe child that no share has: the share's own
// with the last byte changed (shares' MACs differ in more than one byte).
func probeMAC(mac net.HardwareAddr) net.HardwareAddr {
	out := append(net.HardwareAddr(nil), mac...)
	if len(out) == 6 {
		out[5] ^= 0xff
	}
	return out
}

// ensureVLAN returns the parent's VLAN interface, creating it if needed.
func (p *NICPreparer) ensureVLAN(parent netlink.Link, id int) (netlink.Link, error) {
	name := fmt.Sprintf("cv%d.%d", parent.Attrs().Index, id)
	if l, err := p.h.LinkByName(name); err == nil {
		return l, nil
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = name, parent.Attrs().Index
	if err := p.h.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: id}); err != nil {
		return nil, fmt.Errorf("create VLAN %d on %s: %w", id, parent.Attrs().Name, err)
	}
	l, err := p.h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	return l, p.h.LinkSetUp(l)
}

// deleteLinkGroup deletes every interface of group in the calling thread's
// network namespace with one RTM_DELLINK (`ip link del group N`): the kernel
// unregisters them together, waiting for one RCU grace period, not one each.
// The netlink library deletes only by index, so the request is built here
// with its nl package.
func deleteLinkGroup(group uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

package netdev

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// classDropsOf sums the drops HTB counted on the given classes of ifindex,
// asking the kernel for each class alone (RTM_GETTCLASS without a dump): the
// netlink library lists classes only by dumping every class of the device,
// 10,000 of them on a parent holding 1,000 shares. A class that is not there
// counts nothing.
func (p *NICPreparer) classDropsOf(ifindex int, handles []uint32) (uint64, error) {
	sock, err := nl.GetNetlinkSocketAt(p.opts.HostNS, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("netlink in the node's namespace: %w", err)
	}
	defer sock.Close()
	// The reaper asks this under the parent's lock: a kernel that does
	// not answer must not hold it long.
	timeout := unix.NsecToTimeval(classGetTimeout.Nanoseconds())
	if err := sock.SetReceiveTimeout(&timeout); err != nil {
		return 0, err
	}
	sh := &nl.SocketHandle{Socket: sock}
	var total uint64
	for _, handle := range handles {
		drops, err := getClassDrops(sh, ifindex, handle)
		if err != nil {
			return 0, err
		}
		total += drops
	}
	return total, nil
}

// classGetTimeout bounds the wait for the kernel's answer about one class.
const classGetTimeout = 2 * time.Second

// getClassDrops asks the kernel, on sh, for one class's queue statistics and
// returns its drops. The kernel answers a class get only to a request that
// asks for an echo (tclass_get_notify).
func getClassDrops(sh *nl.SocketHandle, ifindex int, handle uint32) (uint64, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETTCLASS, unix.NLM_F_ECHO)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sh}
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: handle})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWTCLASS)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get class %x:%x of ifindex %d: %w", handle>>16, handle&0xffff, ifindex, err)
	}
	for _, m := range msgs {
		msg := nl.DeserializeTcMsg(m)
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			return 0, fmt.Errorf("class %x:%x of ifindex %d: %w", handle>>16, handle&0xffff, ifindex, err)
		}
		for _, a := range attrs {
			if a.Attr.Type != nl.TCA_STATS2 {
				continue
			}
			stats, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return 0, fmt.Errorf("statistics of class %x:%x: %w", handle>>16, handle&0xffff, err)
			}
			for _, s := range stats {
				// struct gnet_stats_queue: qlen, backlog, drops,
				// requeues, overlimits, each a u32.
				if s.Attr.Type == nl.TCA_STATS_QUEUE && len(s.Value) >= 12 {
					return uint64(binary.NativeEndian.Uint32(s.Value[8:12])), nil
				}
			}
		}
	}
	return 0, nil
}

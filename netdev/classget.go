package netdev

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// One class at a time. The netlink library lists classes only by dumping
// every class of a device, 10,000 of them on a parent holding 1,000 shares;
// the kernel also answers for one class (RTM_GETTCLASS without a dump),
// which is what parking (park.go) asks on the prepare's and the reaper's
// path.

// classState is what the kernel says of one HTB class.
type classState struct {
	exists bool
	parked bool   // it carries the parked mark (parkedClass)
	rate   uint32 // its rate in bytes/s (saturated past 4 GB/s): a parked one's names who parked it
	drops  uint64 // HTB's count of its drops
}

// classStates asks the kernel of the node's namespace about the given
// classes of ifindex, in order.
// It asks on the preparer's own socket of that namespace (NICPreparer.route).
func (p *NICPreparer) classStates(ifindex int, handles []uint32) ([]classState, error) {
	out := make([]classState, len(handles))
	for i, handle := range handles {
		var err error
		if out[i], err = getClass(p.route, ifindex, handle); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// getClass asks the kernel, on sh, for one class. The kernel answers a class
// get only to a request that asks for an echo (tclass_get_notify).
func getClass(sh *nl.SocketHandle, ifindex int, handle uint32) (classState, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETTCLASS, unix.NLM_F_ECHO)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sh}
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: handle})
	what := fmt.Sprintf("class %x:%x of ifindex %d", handle>>16, handle&0xffff, ifindex)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWTCLASS)
	if errors.Is(err, unix.ENOENT) {
		return classState{}, nil
	}
	if err != nil {
		return classState{}, fmt.Errorf("get %s: %w", what, err)
	}
	var st classState
	for _, m := range msgs {
		msg := nl.DeserializeTcMsg(m)
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			return classState{}, fmt.Errorf("%s: %w", what, err)
		}
		st.exists = true
		for _, a := range attrs {
			if a.Attr.Type != nl.TCA_STATS2 && a.Attr.Type != nl.TCA_OPTIONS {
				continue // the kind, the older stats, HTB's xstats
			}
			nested, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return classState{}, fmt.Errorf("%s: %w", what, err)
			}
			for _, n := range nested {
				switch {
				case a.Attr.Type == nl.TCA_STATS2 && n.Attr.Type == nl.TCA_STATS_QUEUE && len(n.Value) >= 12:
					// struct gnet_stats_queue: qlen, backlog,
					// drops, requeues, overlimits, each a u32.
					st.drops = uint64(binary.NativeEndian.Uint32(n.Value[8:12]))
				case a.Attr.Type == nl.TCA_OPTIONS && n.Attr.Type == nl.TCA_HTB_PARMS && len(n.Value) >= nl.SizeofTcHtbCopt:
					// The bursts in ticks, as the kernel keeps
					// them: the mark survives the conversion.
					opt := nl.DeserializeTcHtbCopt(n.Value)
					st.parked = opt.Cbuffer > opt.Buffer
					st.rate = opt.Rate.Rate
				}
			}
		}
	}
	return st, nil
}

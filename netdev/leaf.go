package netdev

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// leafDelayMs is how much of its rate a share's queue holds where the leaf
// is a byte FIFO: beyond it, frames are dropped and TCP backs off. HTB's
// default leaf (pfifo of txqueuelen, 1000 frames) held about 1.2 s at 10M.
// At 20 ms a local TCP sender (TSQ lets it queue megabytes when the RTT is
// tiny) lost up to 20% of what it sent at 50M, retransmitted; at 50 ms
// none, with the same goodput.
const leafDelayMs = 50

// leafMinBytes keeps a FIFO leaf able to take one GSO or GRO super-packet
// (up to 64 KiB: a TSO burst from the wire arrives at the IFB merged into
// one) and a frame: smaller, such packets would all be dropped and the
// share starve. It sets the queue's delay at rates under about 10.7 Mbit/s
// (54 ms at 10M).
const leafMinBytes = 65536 + 1514

// fifoLimit is the byte limit of a share's FIFO leaf at rateBits.
func fifoLimit(rateBits uint64) uint32 {
	return uint32(min(max(rateBits/8*leafDelayMs/1000, leafMinBytes), 64<<20))
}

// leafHandle is the handle of the leaf qdisc of class 1:minor: minor's own
// major, which no other qdisc of carve's uses (majors 1 and ffff are taken,
// minors start at minMinor).
func leafHandle(minor uint16) uint32 { return netlink.MakeHandle(minor, 0) }

// fqCodelQuantum is a share's fq_codel leaf's quantum: one full frame, as
// on any Ethernet NIC. fq_codel's default is its device's MTU plus its
// header, and the egress shaper's MTU is 65535 (GSO super-packets cross it
// whole): a 64 KiB quantum is 52 ms of a 10M share per flow per round, and
// in make vmtest's 6.12 guest a pod's ping waited 190 ms at p50 (431 ms
// p99) behind its own 8 TCP flows on egress, against 1.3 / 3.8 ms on the
// IFB, whose MTU is 1500.
const fqCodelQuantum = 1514

// shareFQCodel is the fq_codel leaf of a share's class.
func shareFQCodel(attrs netlink.QdiscAttrs) *netlink.FqCodel {
	q := netlink.NewFqCodel(attrs)
	q.Quantum = fqCodelQuantum
	return q
}

// setLeaf gives class 1:minor a bounded queue: fq_codel where the kernel
// has it (per-flow fairness and a 5 ms target delay within the share), a
// bfifo holding leafDelayMs of the rate otherwise. Replacing the leaf of a
// class that has one is a change in place.
func (p *NICPreparer) setLeaf(link netlink.Link, minor uint16, rateBits uint64) error {
	attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: leafHandle(minor)}
	p.mu.Lock()
	noFQCodel := p.noFQCodel
	p.mu.Unlock()
	if !noFQCodel {
		err := p.h.QdiscReplace(shareFQCodel(attrs))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("fq_codel leaf of class 1:%x on %s: %w", minor, link.Attrs().Name, err)
		}
		// ENOENT: no sch_fq_codel in this kernel; asked once.
		p.mu.Lock()
		p.noFQCodel = true
		p.mu.Unlock()
	}
	if err := replaceBfifo(p.route, attrs, fifoLimit(rateBits)); err != nil {
		return fmt.Errorf("bfifo leaf of class 1:%x on %s: %w", minor, link.Attrs().Name, err)
	}
	return nil
}

// routeTimeout bounds the kernel's answer on NICPreparer.route, asked
// under a parent's lock; the kernel may be busy for a while under its own
// (the reaper removing a device's HTB of thousands of classes).
const routeTimeout = 10 * time.Second

// replaceBfifo creates or replaces a bfifo of limit bytes, on route (a
// socket of the node's namespace); the netlink package sends no options
// for bfifo, so its limit would be txqueuelen × MTU.
func replaceBfifo(route *nl.SocketHandle, attrs netlink.QdiscAttrs, limit uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: route}
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(attrs.LinkIndex), Handle: attrs.Handle, Parent: attrs.Parent})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated("bfifo")))
	opt := make([]byte, 4) // struct tc_fifo_qopt { __u32 limit; }
	binary.NativeEndian.PutUint32(opt, limit)
	req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, opt))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

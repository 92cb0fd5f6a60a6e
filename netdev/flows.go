package netdev

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

// A share's queues. Where the kernel has fq_codel, it is the leaf of the
// share's class: per-flow fairness and a 5 ms target inside the share.
// Where it has not (this project's machines: HTB, bfifo and BPF only), the
// share's class gets children instead, and the classifier sorts its frames
// into them (bpf/flows.h):
//
//   - 1:M+1, priority 0: the share's sparse flows (a ping, DNS, an RPC),
//     served first, so that they never wait behind the share's own bulk
//     transfer;
//   - 1:M+2 to 1:M+9, priority 1: its bulk flows, a child per flow while
//     there are children free, served round-robin a frame at a time, their
//     queues kept near a 5 ms target by the classifier's AQM (bpf/aqm.h),
//     each in a bfifo of leafDelayMs as a last bound.
//
// Every child is assured almost nothing (childRate) and borrows up to the
// share's rate (its ceil) from the share's class, by priority and then
// round-robin: the share's class alone holds them together to its rate. A
// child assured a part of the rate would spend its tokens saved while idle
// without asking the share's class: eight children with an eighth each
// overshot a 10M share by 4%. M is the first minor of the share's block
// (classBlock), so the children need no record of their own.

// flowChildren is how many children a share's class gets: the sparse one
// and the bulk ones.
const flowChildren = bpf.FlowBulkFirst - bpf.FlowSparseChild + bpf.FlowBulkChildren

// childRate is each child's assured rate, bits/s: HTB's smallest sensible
// one (a byte per millisecond).
const childRate = 8000

// setQueues gives the share's class 1:minor on link (of a parent of mtu)
// its queues: an fq_codel
// leaf where the kernel has one (flows false), else the flow children, each
// with a bfifo leaf (flows true: set as soon as a child may exist, so that
// an undo removes the children before their parent).
func (p *NICPreparer) setQueues(link netlink.Link, minor uint16, rateBits uint64, mtu int) (flows bool, err error) {
	p.mu.Lock()
	noFQCodel := p.noFQCodel
	p.mu.Unlock()
	if !noFQCodel {
		attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: leafHandle(minor)}
		err := p.h.QdiscReplace(netlink.NewFqCodel(attrs))
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("fq_codel leaf of class 1:%x on %s: %w", minor, link.Attrs().Name, err)
		}
		// ENOENT: no sch_fq_codel in this kernel; asked once.
		p.mu.Lock()
		p.noFQCodel = true
		p.mu.Unlock()
	}
	buf := htbBuffer(rateBits)
	for i := range flowChildren {
		child := minor + bpf.FlowSparseChild + uint16(i)
		prio := uint32(1)
		if i == 0 {
			prio = 0
		}
		class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: netlink.MakeHandle(1, child)},
			netlink.HtbClassAttrs{Rate: childRate, Ceil: rateBits, Buffer: buf, Cbuffer: buf, Quantum: 1514, Prio: prio})
		err := p.h.ClassAdd(class)
		if errors.Is(err, unix.EEXIST) {
			err = p.h.ClassChange(class)
		}
		if err != nil {
			return true, fmt.Errorf("flow class 1:%x of share class 1:%x on %s: %w", child, minor, link.Attrs().Name, err)
		}
		attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, child), Handle: leafHandle(child)}
		leaf := func() error { return replaceBfifo(attrs, fifoLimit(rateBits)) }
		if i > 0 {
			leaf = func() error {
				return replaceSplittingFIFO(attrs, rateBits, splitBurst(rateBits, mtu), fifoLimit(rateBits))
			}
		}
		if err := hook.InNetns(p.opts.HostNS, leaf); err != nil {
			return true, fmt.Errorf("leaf of flow class 1:%x on %s: %w", child, link.Attrs().Name, err)
		}
	}
	return true, nil
}

// deleteShareClass removes the share's class 1:minor on link, its flow
// children first where it has them: where flows says so, or where the
// kernel says the class has children (a share whose record was lost; carve
// gives a class no other children).
func deleteShareClass(h *netlink.Handle, link netlink.Link, minor uint16, flows bool) error {
	if !flows {
		err := deleteClass(h, link, minor)
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
	}
	for i := flowChildren - 1; i >= 0; i-- {
		if err := deleteClass(h, link, minor+bpf.FlowSparseChild+uint16(i)); err != nil {
			return err
		}
	}
	return deleteClass(h, link, minor)
}

package netdev

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
)

// A share's queues. Where the kernel has fq_codel, it is the leaf of the
// share's class: per-flow fairness and a 5 ms target inside the share.
// Where it has not (this project's machines: HTB, bfifo and BPF only), the
// share's class gets children instead, and the classifier sorts its frames
// into them (bpf/flows.h):
//
//   - 1:M+1, priority 0: the share's sparse flows (a ping, DNS, an RPC),
//     served first, and assured 1/FlowSparseDiv of the share's rate of its
//     own, so that they never wait behind the share's own bulk transfer:
//     not for its queue, and not for the share's tokens, which a bulk
//     super-packet (up to 64 KiB, 52 ms at 10M) spends at once;
//   - 1:M+2 to 1:M+9, priority 1: its bulk flows, a child per flow while
//     there are children free, served round-robin a quantum at a time,
//     their queues kept near a target by the classifier's AQM (bpf/aqm.h),
//     each in a bfifo of leafDelayMs as a last bound.
//
// The bulk children are assured almost nothing (childRate) and borrow up to
// the share's rate (its ceil) from the share's class; the sparse child
// borrows too once past its own part. Every frame, whichever child sent
// it, is charged to the share's class, and the bulk children borrow only
// while the share's class has tokens: the share's class alone holds them
// together to its rate. Bulk children each assured a part of the rate would
// not: eight children with an eighth each overshot a 10M share by 4%, as
// the share's class lent what they had already sent on their own. M is the
// first minor of the share's block (classBlock), so the children need no
// record of their own.
//
// Frames go through the children whole, GSO and GRO super-packets
// included. Until issue 37 the bulk children's leaves split super-packets
// into frames (a tbf), and the share's interface in its pod made
// super-packets of a millisecond of its rate: both cost every frame a trip
// of its own through HTB, its timers and the veths. At a hundred 10M
// shares saturated at once that was 3.3 times the CPU per shaped Gbit/s of
// plain HTB classes, and the node could no longer carry them (MEASURED.md).
// The sparse child's own rate keeps it from waiting behind a super-packet's
// charge; the pod's super-packets stay at about 4 ms of its rate (gso.go),
// since HTB lets each out as one burst, and TCP misreads longer ones.

// flowChildren is how many children a share's class gets: the sparse one
// and the bulk ones.
const flowChildren = bpf.FlowBulkFirst - bpf.FlowSparseChild + bpf.FlowBulkChildren

// childRate is each child's assured rate, bits/s: HTB's smallest sensible
// one (a byte per millisecond).
const childRate = 8000

// childOwnBurst is a bulk child's own bucket, bytes at its own rate
// (childRate): a frame. HTB lets a class with tokens of its own send
// without asking its parent, and a class starts with a full bucket: with
// the share's burst here (8 ms of its rate), a fresh 100M share whose eight
// flows started at once sent 772-894 KB beyond its rate in its first 7-12
// ms (its own burst is 100 KB), and an idle bulk child refilled its bucket
// in 100 s. With a frame, 147-205 KB: the share's burst and the
// super-packets HTB charges after letting them out
// (TestFreshShareHoldsItsRateFromItsFirstFrames). The sparse child keeps
// the share's burst: its pings must not wait for the share's tokens behind
// the bulk children's charges (with two frames, a ping's p99 under 32 flows
// at 10M ingress read 4.1-15.5 ms, against 0.6-1.9), and its own rate
// refills it within 128 ms at any share's rate anyway.
const childOwnBurst = 1514

// setQueues gives the share's class 1:minor on link its queues: an fq_codel
// leaf where the kernel has one (flows false), else the flow children, each
// with a bfifo leaf (flows true: set as soon as a child may exist, so that
// an undo removes the children before their parent).
//
// The children borrow up to the share's ceiling; where the share borrows
// past its floor each child's quantum is the share's (proportional to its
// floor): HTB lends a borrowing parent's excess to its leaves, a quantum at
// a time.
func (p *NICPreparer) setQueues(link netlink.Link, key string, minor uint16, rates classRates) (flows bool, err error) {
	rateBits := rates.floor
	p.mu.Lock()
	noFQCodel, plain := p.noFQCodel, p.plainQueues
	p.mu.Unlock()
	if plain {
		// The design before flow isolation, as the reference of
		// issue 37's measurements (PlainQueues): one bounded FIFO.
		attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: leafHandle(minor)}
		if err := replaceLeafFIFO(p.h, p.route, attrs, fifoLimit(rates.ceil)); err != nil {
			return false, fmt.Errorf("leaf of class 1:%x on %s: %w", minor, link.Attrs().Name, err)
		}
		return false, nil
	}
	if !noFQCodel {
		attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: leafHandle(minor)}
		err := p.h.QdiscReplace(shareFQCodel(attrs))
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
	// Forgotten until every child is set again: a failure half-way
	// leaves children of two rates.
	block := blockKey{device: link.Attrs().Name, ifindex: link.Attrs().Index, base: minor}
	p.mu.Lock()
	delete(p.queuesSet, block)
	p.mu.Unlock()
	buf := htbBuffer(rates.ceil)
	childQuantum := uint32(1514)
	if rates.borrows() {
		childQuantum = rates.quantum()
	}
	for i := range flowChildren {
		child := minor + bpf.FlowSparseChild + uint16(i)
		prio, rate, own := uint32(1), uint64(childRate), uint32(childOwnBurst)
		if i == 0 {
			prio, rate, own = 0, sparseRate(rateBits), buf
		}
		class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, minor), Handle: netlink.MakeHandle(1, child)},
			netlink.HtbClassAttrs{Rate: rate, Ceil: rates.ceil, Buffer: own, Cbuffer: buf, Quantum: childQuantum, Prio: prio})
		// One request, made or changed: the share's own class holds
		// it (a parked block's children are there already).
		if err := p.h.ClassReplace(class); err != nil {
			return true, fmt.Errorf("flow class 1:%x of share class 1:%x on %s: %w", child, minor, link.Attrs().Name, err)
		}
		attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, child), Handle: leafHandle(child)}
		if err := replaceLeafFIFO(p.h, p.route, attrs, fifoLimit(rates.ceil)); err != nil {
			return true, fmt.Errorf("leaf of flow class 1:%x on %s: %w", child, link.Attrs().Name, err)
		}
	}
	p.mu.Lock()
	p.queuesSet[block] = queuesOf{rates: rates, key: key}
	p.mu.Unlock()
	return true, nil
}

// queuesOf is what a block's flow children were last set for by this
// agent: the rates, and the share.
type queuesOf struct {
	rates classRates
	key   string
}

// newParkMark draws an agent's parkMark: 1 to 65535.
func newParkMark() uint32 {
	var b [2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return 1 + uint32(binary.NativeEndian.Uint16(b[:]))%(parkMarkSpan-1)
}

// parkMarkSpan: a parked class's rate in bytes/s, modulo it, is the mark
// of the agent that parked it. HTB keeps a class's DRR quantum only while
// it has no children, and a share class with flow children has some, so
// the mark is in its rate, which HTB keeps for every class and a parked
// class never uses.
const parkMarkSpan = 1 << 16

// parkedRate is the rate, in bits/s, of a class of rateBits parked with
// mark: rateBits rounded up to whole parkMarkSpans of bytes/s, plus the
// mark; under 1.1 Mbit/s more.
func parkedRate(rateBits uint64, mark uint32) uint64 {
	bytes := (rateBits/8 + parkMarkSpan - 1) / parkMarkSpan * parkMarkSpan
	return (bytes + uint64(mark)) * 8
}

// parkedBy says whether a parked class whose rate the kernel gives as
// rateBytes (bytes/s, saturated at 4 GB/s) carries mark.
func parkedBy(rateBytes, mark uint32) bool {
	return mark != 0 && rateBytes != ^uint32(0) && rateBytes%parkMarkSpan == mark
}

// blockKey names a block of classes from base on a device.
type blockKey struct {
	device  string
	ifindex int
	base    uint16
}

// queuesKept says whether the flow children of the parked block pick, taken
// for share key of rates on link, are as setQueues would set them: this
// agent set them last, for the share that was on the block when this agent
// parked it, at the same rates; then the block is handed to key. A parked
// block's children are left as their last share had them (parking changes
// the share class only), so a pod of the same size as the last spares
// twenty requests under the parent's lock (issue 44). Another agent that
// took the block since (a rolling update's) parks it with its own quantum.
func (p *NICPreparer) queuesKept(link netlink.Link, key string, pick minorPick, rates classRates) bool {
	if !pick.parked || !pick.flows || !pick.parkedHere {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	block := blockKey{device: link.Attrs().Name, ifindex: link.Attrs().Index, base: pick.minor}
	set, ok := p.queuesSet[block]
	if !ok || !p.noFQCodel || set.rates != rates {
		return false
	}
	p.queuesSet[block] = queuesOf{rates: rates, key: key}
	return true
}

// sparseRate is what a share of rateBits assures its sparse child: as much
// as FlowSparseDiv sparse flows send at most (a flow past it is bulk), and
// never under childRate.
func sparseRate(rateBits uint64) uint64 {
	return max(rateBits/bpf.FlowSparseDiv, childRate)
}

// replaceLeafFIFO makes a flow child's leaf a bfifo of limit bytes, with h
// and route of the node's namespace. A parked block an agent before issue
// 37 made has a tbf there, which a bfifo cannot replace in place (the
// kernel refuses a change of kind under one handle): it is deleted first.
func replaceLeafFIFO(h *netlink.Handle, route *nl.SocketHandle, attrs netlink.QdiscAttrs, limit uint32) error {
	err := replaceBfifo(route, attrs, limit)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	old := &netlink.GenericQdisc{QdiscAttrs: attrs, QdiscType: "tbf"}
	if derr := h.QdiscDel(old); derr != nil && !errors.Is(derr, unix.ENOENT) {
		return errors.Join(err, derr)
	}
	return replaceBfifo(route, attrs, limit)
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

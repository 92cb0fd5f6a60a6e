package netdev

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
)

// shape gives the share a class of rate bits/s on dev and points the
// classifier at it.
func (p *NICPreparer) shape(dev netlink.Link, key string, rate uint64, dir bpf.Direction, mac net.HardwareAddr) (uint16, error) {
	// The device's HTB is made once and then known (under the parent's
	// lock): a steady-state prepare makes no qdisc dump.
	if !p.setUp.has("htb", dev.Attrs().Index) {
		if err := ensureHTB(p.h, dev); err != nil {
			return 0, err
		}
		p.setUp.add("htb", dev.Attrs().Index)
	}
	minor, err := p.addClass(dev, key, rate)
	if err != nil {
		p.setUp.forget("htb", dev.Attrs().Index)
		return 0, err
	}
	// From here on the class exists: the minor is returned with any
	// error, so that the undo removes the class. The classifier entry,
	// the only other record of it, is written last and may never be.
	if err := p.setLeaf(dev, minor, rate); err != nil {
		return minor, err
	}
	// Attached (and checked to be first on the hook) once per device
	// while it is set up, not by every share.
	if what := "classifier-" + dir.String(); !p.setUp.has(what, dev.Attrs().Index) {
		if err := inNetns(p.opts.HostNS, func() error { return p.opts.Shaper.Attach(dev.Attrs().Index, dir) }); err != nil {
			return minor, fmt.Errorf("attach the classifier to %s: %w", dev.Attrs().Name, err)
		}
		p.setUp.add(what, dev.Attrs().Index)
	}
	if err := p.opts.Shaper.SetShare(dir, mac, uint32(netlink.MakeHandle(1, minor))); err != nil {
		return minor, fmt.Errorf("classifier entry: %w", err)
	}
	return minor, nil
}

// addClass gives key a class of rate bits/s on dev and returns its minor.
// The minor is picked from this agent's own record of the device's classes;
// only where the kernel says it is taken (another agent's, during a rolling
// update) are the device's classes listed and the pick made again.
func (p *NICPreparer) addClass(dev netlink.Link, key string, rate uint64) (uint16, error) {
	minor, own, err := p.pickMinor(dev.Attrs().Name, key, nil)
	if err != nil {
		return 0, err
	}
	err = setClass(p.h, dev, minor, rate, own)
	if !errors.Is(err, errClassTaken) {
		return minor, err
	}
	p.unpickMinor(dev.Attrs().Name, minor, key)
	taken, err := shareClasses(p.h, dev)
	if err != nil {
		return 0, err
	}
	if minor, own, err = p.pickMinor(dev.Attrs().Name, key, taken); err != nil {
		return 0, err
	}
	return minor, setClass(p.h, dev, minor, rate, own)
}

// edtOn reports whether the parent's egress is paced with EDT: where the
// kernel has sch_fq, carve puts fq at the parent's root (unless carve's HTB
// already holds it) and stamps each share's frames with their earliest
// departure time, which costs less than HTB's class tree.
func (p *NICPreparer) edtOn(parent netlink.Link) bool {
	p.mu.Lock()
	noFQ := p.noFQ
	p.mu.Unlock()
	if noFQ {
		return false // no sch_fq in this kernel, so no fq root either
	}
	qdiscs, err := p.h.QdiscList(parent)
	if err != nil {
		return false
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		switch {
		case q.Type() == "fq":
			return true
		case q.Type() == "htb" && q.Attrs().Handle == rootHandle:
			return false
		}
	}
	if _, err := checkRootReplaceable(p.h, parent); err != nil {
		return false // HTB's ensureHTB refuses it, saying why
	}
	fq := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0x8000, 0)}}
	if err := p.h.QdiscReplace(fq); err != nil {
		// No sch_fq in this kernel: HTB it is, from now on.
		p.mu.Lock()
		p.noFQ = true
		p.mu.Unlock()
		return false
	}
	return true
}

// pace holds mac's frames to rate bits/s by EDT on the parent's fq.
func (p *NICPreparer) pace(parent netlink.Link, mac net.HardwareAddr, rate uint64) error {
	if err := inNetns(p.opts.HostNS, func() error { return p.opts.Shaper.AttachEDT(parent.Attrs().Index) }); err != nil {
		return fmt.Errorf("attach the EDT program to %s: %w", parent.Attrs().Name, err)
	}
	if err := p.opts.Shaper.SetRate(mac, rate); err != nil {
		return fmt.Errorf("EDT rate entry: %w", err)
	}
	return nil
}

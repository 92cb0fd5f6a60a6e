package netdev

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
)

// shape gives the share a class of rate bits/s on dev and points the
// classifier at it.
func (p *NICPreparer) shape(dev netlink.Link, key string, rate uint64, dir bpf.Direction, mac net.HardwareAddr) (uint16, error) {
	if err := ensureHTB(p.h, dev); err != nil {
		return 0, err
	}
	taken, err := shareClasses(p.h, dev)
	if err != nil {
		return 0, err
	}
	minor, own, err := p.pickMinor(dev.Attrs().Name, key, taken)
	if err != nil {
		return 0, err
	}
	if err := setClass(p.h, dev, minor, rate, own); err != nil {
		return 0, err
	}
	// From here on the class exists: the minor is returned with any
	// error, so that the undo removes the class. The classifier entry,
	// the only other record of it, is written last and may never be.
	if err := p.setLeaf(dev, minor, rate); err != nil {
		return minor, err
	}
	if err := inNetns(p.opts.HostNS, func() error { return p.opts.Shaper.Attach(dev.Attrs().Index, dir) }); err != nil {
		return minor, fmt.Errorf("attach the classifier to %s: %w", dev.Attrs().Name, err)
	}
	if err := p.opts.Shaper.SetShare(dir, mac, uint32(netlink.MakeHandle(1, minor))); err != nil {
		return minor, fmt.Errorf("classifier entry: %w", err)
	}
	return minor, nil
}

// edtOn reports whether the parent's egress is paced with EDT: where the
// kernel has sch_fq, carve puts fq at the parent's root (unless carve's HTB
// already holds it) and stamps each share's frames with their earliest
// departure time, which costs less than HTB's class tree.
func (p *NICPreparer) edtOn(parent netlink.Link) bool {
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
	p.mu.Lock()
	noFQ := p.noFQ
	p.mu.Unlock()
	if noFQ {
		return false
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

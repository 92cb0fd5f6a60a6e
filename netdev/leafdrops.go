package netdev

import "github.com/vishvananda/netlink"

// leafDrops maps each class of link's HTB whose leaf is fq_codel to what
// that leaf dropped inside itself: its overflow (it drops from the fattest
// flow and answers HTB NET_XMIT_CN or success) and CoDel's drops at
// dequeue, none of which HTB counts at the class. Without them a share's
// drops read 0 under a UDP flood wherever the kernel has fq_codel
// (TestShareMetricsFromShapersAndIFBs in make vmtest's 6.12 guest). A
// bfifo's drops are refusals HTB counts itself, so only fq_codel's are
// added. Nil where the qdiscs cannot be read: the classes' own counts stand.
func leafDrops(h *netlink.Handle, link netlink.Link) map[uint32]uint64 {
	qdiscs, err := h.QdiscList(link)
	if err != nil {
		return nil
	}
	out := map[uint32]uint64{}
	for _, q := range qdiscs {
		a := q.Attrs()
		if q.Type() != "fq_codel" || a.Statistics == nil || a.Statistics.Queue == nil {
			continue
		}
		if major, _ := netlink.MajorMinor(a.Parent); major != 1 {
			continue // not under carve's HTB (1:)
		}
		out[a.Parent] += uint64(a.Statistics.Queue.Drops)
	}
	return out
}

// fqCodelLeafDrops is leafDrops on the unprepare's path: where the leaves
// are bfifos (no fq_codel in this kernel) there is nothing to add, and the
// dump of every qdisc of the device, twenty a share with flow children,
// is skipped: under a hundred unprepares at once it was their largest
// wait under the parent's lock (issue 44).
func (p *NICPreparer) fqCodelLeafDrops(link netlink.Link) map[uint32]uint64 {
	p.mu.Lock()
	bfifos := p.noFQCodel
	p.mu.Unlock()
	if bfifos {
		return nil
	}
	return leafDrops(p.h, link)
}

package sharelist

import (
	"fmt"
	"net/netip"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
)

// node is what the NIC listing reads of the node: the classifier's pinned
// maps and links, and the links and HTB classes of the node's network
// namespace. Tests give a fake.
type node interface {
	// mapsErr says why the classifier's maps could not be opened; nil
	// where they were.
	mapsErr() error
	shares() (map[bpf.Key]uint32, error)
	stats() (map[bpf.Key]bpf.Counters, error)
	spoofDrops() (map[string]bpf.SpoofDrops, error)
	rates() (map[string]uint64, error)
	// shareAddrs lists the addresses of shares told apart by address
	// (ipvlan).
	shareAddrs() ([]bpf.AddrShare, error)
	egressShapers() (map[int]bpf.EgressShaperLinks, error)
	links() ([]bpf.PinnedLink, error)
	// netnsIno is the inode of the node's network namespace, which names
	// its pinned links.
	netnsIno() uint64
	linkIndex(name string) (int, error)
	// classDrops returns the HTB classes of a device, by handle, with the
	// packets each dropped.
	classDrops(ifindex int) (map[uint32]uint64, error)
	// aqm returns what each share's AQM (bpf/aqm.h) dropped and marked.
	aqm() (map[bpf.Key]bpf.AQMCounters, error)
	// classQueues returns the queue discipline of a device's share
	// classes, by handle: "flows+codel" (carve's flow children and AQM),
	// or the kind of the class's leaf (fq_codel, bfifo, pfifo where it
	// has none of its own).
	classQueues(ifindex int) (map[uint32]string, error)
	// legacyFilter reports whether the cls_bpf filter name is on the
	// device's clsact hook (kernels without TCX).
	legacyFilter(ifindex int, ingress bool, name string) bool
	// podGuard is the state of the pod guard of the share whose link is
	// name (bpf.PodGuardState).
	podGuard(name string) (string, error)
}

// check fills a NIC share's row from its undo record and what the node holds:
// each direction with a bandwidth needs its class, its classifier entry
// and the classifier's links.
func (st *state) check(n node, r *Row, u netdev.ShareRecord) {
	r.Parent, r.Link = u.Parent, u.Link
	r.EgressRate, r.IngressRate = st.rate(u.MAC, bpf.Egress), st.rate(u.MAC, bpf.Ingress)
	r.EgressCeiling, r.IngressCeiling = int64(u.EgressCeiling), int64(u.IngressCeiling)
	r.Borrowing = borrowing(*r)
	for reason, n := range st.spoofed[u.MAC] {
		if r.Spoofed == nil {
			r.Spoofed = map[string]uint64{}
		}
		r.Spoofed[reason.String()] = n
	}
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	if u.PodGuard {
		// Every share's, limited or not: what the pod may send.
		state, err := n.podGuard(u.Link)
		switch {
		case err != nil:
			problem("pod guard: %v", err)
		case state == "":
			problem("pod guard: not pinned")
		case state == bpf.PodGuardDetached:
			problem("pod guard: detached (the interface it checked is gone)")
		}
		r.PodGuard = state
	}
	if r.EgressBandwidth == 0 && r.IngressBandwidth == 0 {
		return // nothing to hold
	}
	if st.mapsErr != nil {
		problem("classifier maps: %v", st.mapsErr)
		return
	}
	parent, err := st.index(n, u.Parent)
	if err != nil {
		problem("parent %s: %v", u.Parent, err)
		return
	}
	if r.EgressBandwidth > 0 {
		if u.EgressEDT {
			if st.rates[u.MAC] == 0 {
				problem("egress: no EDT rate for %s", u.MAC)
			}
			st.needLink(n, r, "edt_egress", u.Parent, parent, false)
		} else {
			st.needEgressShaper(n, r, u, parent)
		}
	}
	if u.AddressKeyed {
		st.needAddrs(r, u, parent)
	}
	if r.IngressBandwidth > 0 {
		name := netdev.IFBName(parent)
		ifb, err := st.index(n, name)
		if err != nil {
			problem("ingress: IFB %s: %v", name, err)
			return
		}
		st.needClass(n, r, "ingress", name, ifb, u.MAC, bpf.Ingress, u.IngressMinor, u.IngressDropBase)
		st.needLink(n, r, "classify_ingress", name, ifb, false)
		st.needLink(n, r, "redirect_ingress", u.Parent, parent, true)
	}
}

// needEgressShaper checks the share's egress class on the parent's egress
// shaper, the classifier on the parent, the classifier's entry sending the
// parent's limited shares to the shaper and the program on the shaper's
// return end. An older carve's share has its class on the parent itself.
func (st *state) needEgressShaper(n node, r *Row, u netdev.ShareRecord, parent int) {
	name := netdev.EgressShaperName(parent)
	shaper, err := st.index(n, name)
	if err != nil {
		if _, ok := st.classesOfOK(n, parent)[netdev.ClassHandle(u.EgressMinor)]; ok {
			st.needClass(n, r, "egress", u.Parent, parent, u.MAC, bpf.Egress, u.EgressMinor, u.EgressDropBase)
			st.needLink(n, r, "classify_egress", u.Parent, parent, false)
			return
		}
		r.Problems = append(r.Problems, fmt.Sprintf("egress: shaper %s: %v", name, err))
		return
	}
	st.needClass(n, r, "egress", name, shaper, u.MAC, bpf.Egress, u.EgressMinor, u.EgressDropBase)
	st.needLink(n, r, "classify_egress", u.Parent, parent, false)
	backName := netdev.EgressReturnName(parent)
	back, err := st.index(n, backName)
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("egress: shaper's return end %s: %v", backName, err))
		return
	}
	st.needLink(n, r, "return_shaped", backName, back, true)
	if got, ok := st.egressShapers[parent]; !ok || got != (bpf.EgressShaperLinks{Shaper: shaper, Return: back}) {
		r.Problems = append(r.Problems, fmt.Sprintf("egress: the classifier does not send %s's limited shares through %s", u.Parent, name))
	}
}

// classesOfOK is classesOf, with none where they cannot be dumped.
func (st *state) classesOfOK(n node, ifindex int) map[uint32]uint64 {
	c, _ := st.classesOf(n, ifindex)
	return c
}

// needClass checks the share's class on a device and its classifier entry,
// and adds the class's drops past dropBase (what its classes had counted
// before the share took them over).
func (st *state) needClass(n node, r *Row, dir, dev string, ifindex int, mac string, d bpf.Direction, minor uint16, dropBase uint64) {
	if minor == 0 {
		r.Problems = append(r.Problems, dir+": no class recorded")
		return
	}
	handle := netdev.ClassHandle(minor)
	classes, err := st.classesOf(n, ifindex)
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("%s: classes of %s: %v", dir, dev, err))
	} else if drops, ok := classes[handle]; !ok {
		r.Problems = append(r.Problems, fmt.Sprintf("%s: class 1:%x missing on %s", dir, minor, dev))
	} else if drops >= dropBase {
		r.Drops += drops - dropBase
	}
	aqm := st.aqm[bpf.Key{MAC: mac, Dir: d}]
	r.Drops += aqm.Drops
	r.Marks += aqm.Marks
	if q := st.queuesOf(n, ifindex)[handle]; q != "" {
		if d == bpf.Egress {
			r.EgressQueue = q
		} else {
			r.IngressQueue = q
		}
	}
	if got, ok := st.shares[bpf.Key{MAC: mac, Dir: d}]; !ok {
		r.Problems = append(r.Problems, fmt.Sprintf("%s: no classifier entry for %s", dir, mac))
	} else if got != handle {
		r.Problems = append(r.Problems, fmt.Sprintf("%s: classifier sends %s to class %x, not 1:%x", dir, mac, got, minor))
	}
}

// needAddrs checks that every address of a share told apart by address
// names it on its parent: an address missing there leaves its traffic
// unshaped.
func (st *state) needAddrs(r *Row, u netdev.ShareRecord, parent int) {
	if len(u.Addresses) == 0 {
		r.Problems = append(r.Problems, "keyed by address, but has none")
	}
	for _, s := range u.Addresses {
		pfx, err := netip.ParsePrefix(s)
		addr := pfx.Addr()
		if err != nil {
			addr, err = netip.ParseAddr(s)
		}
		if err != nil {
			r.Problems = append(r.Problems, fmt.Sprintf("address %q: %v", s, err))
			continue
		}
		got, ok := st.addrs[bpf.AddrShare{Parent: parent, VLAN: u.VLAN, Addr: addr}]
		if u.VLAN == 0 && (!ok || got != u.MAC) {
			// A record of a carve before addresses were kept by VLAN
			// names none: the agent has since moved a VLAN share's
			// entries into its VLAN.
			for k, mac := range st.addrs {
				if k.Parent == parent && k.Addr == addr && mac == u.MAC {
					got, ok = mac, true
				}
			}
		}
		if !ok {
			r.Problems = append(r.Problems, fmt.Sprintf("no classifier entry for address %s on %s", addr, u.Parent))
		} else if got != u.MAC {
			r.Problems = append(r.Problems, fmt.Sprintf("classifier gives address %s on %s to share %s", addr, u.Parent, got))
		}
	}
}

// needLink checks that program is attached to the device: by its pinned
// TCX link in the node's namespace, or by its cls_bpf filter.
func (st *state) needLink(n node, r *Row, program, dev string, ifindex int, ingress bool) {
	for _, l := range st.links {
		if l.Program == program && l.NetnsIno == n.netnsIno() && l.Ifindex == ifindex && l.Ingress == ingress {
			return
		}
	}
	if n.legacyFilter(ifindex, ingress, bpf.LegacyFilterName(program)) {
		return
	}
	r.Problems = append(r.Problems, fmt.Sprintf("%s not attached to %s", program, dev))
}

func (st *state) index(n node, name string) (int, error) {
	if i, ok := st.ifindex[name]; ok {
		return i, nil
	}
	if err, ok := st.linkErrs[name]; ok {
		return 0, err
	}
	i, err := n.linkIndex(name)
	if err != nil {
		st.linkErrs[name] = err
		return 0, err
	}
	st.ifindex[name] = i
	return i, nil
}

// queuesOf reads a device's queue disciplines once per listing; none where
// they cannot be read (the class check says what is wrong).
func (st *state) queuesOf(n node, ifindex int) map[uint32]string {
	if q, ok := st.queues[ifindex]; ok {
		return q
	}
	q, _ := n.classQueues(ifindex)
	st.queues[ifindex] = q
	return q
}

// classesOf dumps a device's classes once per listing: only the devices
// that hold shares are dumped.
func (st *state) classesOf(n node, ifindex int) (map[uint32]uint64, error) {
	if c, ok := st.classes[ifindex]; ok {
		return c, nil
	}
	c, err := n.classDrops(ifindex)
	if err != nil {
		return nil, err
	}
	st.classes[ifindex] = c
	return c, nil
}

// rate is the share's measured rate in one direction, in bits/s.
func (st *state) rate(mac string, d bpf.Direction) int64 {
	if st.elapsed <= 0 {
		return 0
	}
	k := bpf.Key{MAC: mac, Dir: d}
	after, before := st.after[k], st.before[k]
	if after.Bytes < before.Bytes { // the entry was made again meanwhile
		return 0
	}
	return int64(float64(after.Bytes-before.Bytes) * 8 / st.elapsed.Seconds())
}

// borrowing lists the directions in which a share that may borrow is
// measured over its floor. The classifier's bytes count a GSO
// super-packet's headers once, so a share held at its floor reads about
// 0.956 of it: any reading over the floor is borrowed.
func borrowing(r Row) []string {
	var out []string
	for _, d := range []struct {
		name              string
		floor, ceil, rate int64
	}{{"egress", r.EgressBandwidth, r.EgressCeiling, r.EgressRate}, {"ingress", r.IngressBandwidth, r.IngressCeiling, r.IngressRate}} {
		if d.ceil > d.floor && d.rate > d.floor {
			out = append(out, d.name)
		}
	}
	return out
}

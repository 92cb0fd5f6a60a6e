package netdev

import (
	"maps"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

var (
	shareBytes = prometheus.NewDesc("carve_share_bytes_total",
		"Bytes of a NIC share's frames seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	sharePackets = prometheus.NewDesc("carve_share_packets_total",
		"Packets (GSO super-packets count once) of a NIC share seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	shareDrops = prometheus.NewDesc("carve_share_drops_total",
		"Packets the share's HTB class dropped, by direction.", []string{"claim", "share_id", "direction"}, nil)
	shareAllocated = prometheus.NewDesc("carve_share_allocated_bits_per_second",
		"A NIC share's allocated bandwidth, by direction (the dashboard's line against its measured rate).", []string{"claim", "share_id", "direction"}, nil)
	shareSpoofDrops = prometheus.NewDesc("carve_share_spoofed_frames_dropped_total",
		"Frames a pod sent through its NIC share that the classifier dropped for claiming another's identity, by reason "+
			"(source-mac, vlan-tag, source-ip, arp-sender, nd-target).", []string{"claim", "share_id", "reason"}, nil)
	shareNestedLinks = prometheus.NewDesc("carve_share_nested_links_removed_total",
		"Links (macvlan, macvtap, ipvlan, ipvtap) a NIC share's pod nested on the node's NIC, which the agent removed.", []string{"claim", "share_id"}, nil)
)

// shareLabels name a share in metrics, with its allocated bandwidth (bits
// per second, 0 where it asked for none).
type shareLabels struct {
	claim, shareID string
	// link is the share's interface's name on the node (LinkName).
	link                    string
	egressBits, ingressBits int64
	// egressCeil and ingressCeil are a borrowing share's ceilings, bits
	// per second (0: a hard cap).
	egressCeil, ingressCeil int64
	// netAdmin: the share's class lets its pods have CAP_NET_ADMIN, and
	// so nest links on it (nested.go).
	netAdmin bool
	// dropBase is what the share's classes had counted before it took
	// them over, by direction (park.go).
	dropBase map[bpf.Direction]uint64
}

// withDropBase is l with what the share's record adds: its drop bases and
// its ceilings.
func (l shareLabels) withDropBase(u undoRecord) shareLabels {
	l.egressCeil, l.ingressCeil = int64(u.EgressCeiling), int64(u.IngressCeiling)
	if u.EgressDropBase > 0 || u.IngressDropBase > 0 {
		l.dropBase = map[bpf.Direction]uint64{bpf.Egress: u.EgressDropBase, bpf.Ingress: u.IngressDropBase}
	}
	return l
}

func labelsOf(a prepare.Allocation) shareLabels {
	l := shareLabels{claim: a.ClaimNamespace + "/" + a.ClaimName, link: LinkName(a.ShareKey())}
	if eff, err := prepare.DecodeEffectiveConfig(a.Config); err == nil && eff.Network != nil {
		l.netAdmin = eff.Network.AllowNetAdmin
	}
	if a.ShareID != nil {
		l.shareID = string(*a.ShareID)
	}
	if q, ok := a.Consumed[names.CapEgressBandwidth]; ok {
		l.egressBits = q.Value()
	}
	if q, ok := a.Consumed[names.CapIngressBandwidth]; ok {
		l.ingressBits = q.Value()
	}
	return l
}

var _ prometheus.Collector = (*NICPreparer)(nil)

// Describe implements prometheus.Collector.
func (p *NICPreparer) Describe(ch chan<- *prometheus.Desc) {
	ch <- shareBytes
	ch <- sharePackets
	ch <- shareDrops
	ch <- shareSpoofDrops
	ch <- shareAllocated
	ch <- shareNestedLinks
	ch <- shareCeiling
	ch <- shareBorrowed
}

// Collect reports every prepared share's counters, read from the BPF maps
// and the HTB classes when scraped.
func (p *NICPreparer) Collect(ch chan<- prometheus.Metric) {
	if p.opts.Shaper == nil {
		return
	}
	stats, err := p.opts.Shaper.Stats()
	if err != nil {
		return
	}
	p.mu.Lock()
	labels := maps.Clone(p.labels)
	nested := maps.Clone(p.nestedRemoved)
	p.mu.Unlock()
	for mac, n := range nested {
		if l, ok := labels[mac]; ok {
			ch <- prometheus.MustNewConstMetric(shareNestedLinks, prometheus.CounterValue, float64(n), l.claim, l.shareID)
		}
	}
	for _, l := range labels {
		for dir, bits := range map[string]int64{"egress": l.egressBits, "ingress": l.ingressBits} {
			if bits > 0 {
				ch <- prometheus.MustNewConstMetric(shareAllocated, prometheus.GaugeValue, float64(bits), l.claim, l.shareID, dir)
			}
		}
	}
	p.collectBorrowed(ch, stats, labels, time.Now())
	for key, c := range stats {
		l, ok := labels[key.MAC]
		if !ok {
			continue
		}
		dir := key.Dir.String()
		ch <- prometheus.MustNewConstMetric(shareBytes, prometheus.CounterValue, float64(c.Bytes), l.claim, l.shareID, dir)
		ch <- prometheus.MustNewConstMetric(sharePackets, prometheus.CounterValue, float64(c.Packets), l.claim, l.shareID, dir)
	}
	for key, drops := range p.classDrops() {
		if l, ok := labels[key.MAC]; ok {
			if base := l.dropBase[key.Dir]; drops >= base {
				drops -= base
			}
			ch <- prometheus.MustNewConstMetric(shareDrops, prometheus.CounterValue, float64(drops), l.claim, l.shareID, key.Dir.String())
		}
	}
	spoofed, err := p.opts.Shaper.SpoofDrops()
	if err != nil {
		return
	}
	for mac, byReason := range spoofed {
		l, ok := labels[mac]
		if !ok {
			continue
		}
		for reason, n := range byReason {
			ch <- prometheus.MustNewConstMetric(shareSpoofDrops, prometheus.CounterValue, float64(n), l.claim, l.shareID, reason.String())
		}
	}
}

// classDrops maps each share to its HTB class's drop count. Only the
// devices that hold share classes (the parents' egress shapers and IFBs)
// are dumped, on a netlink socket of the metrics' own: listing every link
// took a dump per link (2064 on a node with 2048 VFs) on the socket
// prepare uses.
func (p *NICPreparer) classDrops() map[bpf.Key]uint64 {
	shares, err := p.opts.Shaper.Shares()
	if err != nil {
		return nil
	}
	// A share's egress class (on the egress shaper) and ingress class (on
	// the IFB) usually have the same minor: classes are told apart by the
	// device they are on.
	byClass := map[bpf.Direction]map[uint32]bpf.Key{bpf.Egress: {}, bpf.Ingress: {}}
	for k, classid := range shares {
		if m, ok := byClass[k.Dir]; ok {
			m[classid] = k
		}
	}
	p.mu.Lock()
	var devices []string
	for dev, set := range p.minors {
		if len(set) > 0 {
			devices = append(devices, dev)
		}
	}
	p.mu.Unlock()
	h, err := netlink.NewHandleAt(p.opts.HostNS)
	if err != nil {
		return nil
	}
	defer h.Close()
	dumped := map[int]bool{}
	out := map[bpf.Key]uint64{}
	dump := func(link netlink.Link) {
		dir := bpf.Egress
		if strings.HasPrefix(link.Attrs().Name, "cvifb") {
			dir = bpf.Ingress
		}
		if dumped[link.Attrs().Index] {
			return
		}
		dumped[link.Attrs().Index] = true
		classes, err := h.ClassList(link, rootHandle)
		if err != nil {
			return
		}
		leaves := leafDrops(h, link)
		for _, c := range classes {
			k, ok := byClass[dir][c.Attrs().Handle]
			if !ok {
				// A share's flow child (flows.go): HTB counts
				// drops at leaves only.
				k, ok = byClass[dir][c.Attrs().Parent]
			}
			if !ok || c.Attrs().Statistics == nil || c.Attrs().Statistics.Queue == nil {
				continue
			}
			out[k] += uint64(c.Attrs().Statistics.Queue.Drops) + leaves[c.Attrs().Handle]
		}
	}
	for _, dev := range devices {
		link, err := h.LinkByName(dev)
		if err != nil {
			continue
		}
		dump(link) // an IFB, or a parent an older carve put its HTB on
		// Egress classes are on the parent's egress shaper. Restore
		// records a share's ingress minor under its parent, so the
		// parent's IFB is looked at whatever the records say.
		if !discovery.IsCarveLink(dev) {
			for _, name := range []string{egressShaperName(link.Attrs().Index), IFBName(link.Attrs().Index)} {
				if l, err := h.LinkByName(name); err == nil {
					dump(l)
				}
			}
		}
	}
	return out
}

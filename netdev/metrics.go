package netdev

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare"
)

var (
	shareBytes = prometheus.NewDesc("carve_share_bytes_total",
		"Bytes of a NIC share's frames seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	sharePackets = prometheus.NewDesc("carve_share_packets_total",
		"Packets (GSO super-packets count once) of a NIC share seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	shareDrops = prometheus.NewDesc("carve_share_drops_total",
		"Packets the share's HTB class dropped, by direction.", []string{"claim", "share_id", "direction"}, nil)
)

// shareLabels name a share in metrics.
type shareLabels struct {
	claim, shareID string
}

func labelsOf(a prepare.Allocation) shareLabels {
	l := shareLabels{claim: a.ClaimNamespace + "/" + a.ClaimName}
	if a.ShareID != nil {
		l.shareID = string(*a.ShareID)
	}
	return l
}

var _ prometheus.Collector = (*NICPreparer)(nil)

// Describe implements prometheus.Collector.
func (p *NICPreparer) Describe(ch chan<- *prometheus.Desc) {
	ch <- shareBytes
	ch <- sharePackets
	ch <- shareDrops
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
	p.mu.Unlock()
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
			ch <- prometheus.MustNewConstMetric(shareDrops, prometheus.CounterValue, float64(drops), l.claim, l.shareID, key.Dir.String())
		}
	}
}

// classDrops maps each share to its HTB class's drop count.
func (p *NICPreparer) classDrops() map[bpf.Key]uint64 {
	shares, err := p.opts.Shaper.Shares()
	if err != nil {
		return nil
	}
	byClass := map[uint32]bpf.Key{}
	for k, classid := range shares {
		byClass[classid] = k
	}
	out := map[bpf.Key]uint64{}
	links, err := p.h.LinkList()
	if err != nil {
		return nil
	}
	for _, link := range links {
		classes, err := p.h.ClassList(link, rootHandle)
		if err != nil {
			continue
		}
		for _, c := range classes {
			k, ok := byClass[c.Attrs().Handle]
			if !ok || c.Attrs().Statistics == nil || c.Attrs().Statistics.Queue == nil {
				continue
			}
			out[k] += uint64(c.Attrs().Statistics.Queue.Drops)
		}
	}
	return out
}

package netdev

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-dra/carve/bpf"
)

var (
	shareBytes = prometheus.NewDesc("carve_share_bytes_total",
		"Bytes of a NIC share's frames seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	sharePackets = prometheus.NewDesc("carve_share_packets_total",
		"Packets (GSO super-packets count once) of a NIC share seen by the classifier, by direction.", []string{"claim", "share_id", "direction"}, nil)
	shareDrops = prometheus.NewDesc("carve_share_drops_total",
		"Packets the share's HTB class dropped, by direction.", []string{"claim", "share_id", "direction"}, nil)
)

// Describe implements prometheus.Collector.
func (p *Preparer) Describe(ch chan<- *prometheus.Desc) {
	ch <- shareBytes
	ch <- sharePackets
	ch <- shareDrops
}

// Collect reports every prepared share's counters, read from the BPF maps
// and the HTB classes when scraped.
func (p *Preparer) Collect(ch chan<- prometheus.Metric) {
	if p.opts.Shaper == nil {
		return
	}
	stats, err := p.opts.Shaper.Stats()
	if err != nil {
		return
	}
	p.mu.Lock()
	labels := make(map[string]shareLabels, len(p.labels))
	for k, v := range p.labels {
		labels[k] = v
	}
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
func (p *Preparer) classDrops() map[bpf.Key]uint64 {
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

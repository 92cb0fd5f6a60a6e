package netdev

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-dra/carve/bpf"
)

var (
	shareCeiling = prometheus.NewDesc("carve_share_ceiling_bits_per_second",
		"What a NIC share that borrows the link's idle capacity may reach, by direction (its allocated bandwidth is its floor).",
		[]string{"claim", "share_id", "direction"}, nil)
	shareBorrowed = prometheus.NewDesc("carve_share_borrowed_bytes_total",
		"Bytes a NIC share sent or received over its floor, by direction: between two scrapes, what its classifier counted past "+
			"its floor's worth of the interval (the classifier counts a GSO super-packet's headers once, so this reads a little low).",
		[]string{"claim", "share_id", "direction"}, nil)
)

// borrowedCounter follows one share's direction between scrapes.
type borrowedCounter struct {
	bytes    uint64    // the classifier's count at the last scrape
	at       time.Time // when
	borrowed float64   // bytes over the floor, summed
}

// collectBorrowed reports each borrowing share's ceiling, and adds to its
// borrowed bytes what its counters grew past its floor since the last
// scrape. The caller passes the classifier's counters and the labels, as
// Collect read them.
func (p *NICPreparer) collectBorrowed(ch chan<- prometheus.Metric, stats map[bpf.Key]bpf.Counters, labels map[string]shareLabels, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.borrowed == nil {
		p.borrowed = map[bpf.Key]*borrowedCounter{}
	}
	seen := map[bpf.Key]bool{}
	for mac, l := range labels {
		for _, d := range []struct {
			dir         bpf.Direction
			floor, ceil int64
		}{{bpf.Egress, l.egressBits, l.egressCeil}, {bpf.Ingress, l.ingressBits, l.ingressCeil}} {
			if d.ceil <= d.floor {
				continue
			}
			k := bpf.Key{MAC: mac, Dir: d.dir}
			seen[k] = true
			ch <- prometheus.MustNewConstMetric(shareCeiling, prometheus.GaugeValue, float64(d.ceil), l.claim, l.shareID, d.dir.String())
			c, ok := p.borrowed[k]
			if !ok {
				c = &borrowedCounter{bytes: stats[k].Bytes, at: now}
				p.borrowed[k] = c
			} else if got := stats[k].Bytes; got >= c.bytes {
				over := float64(got-c.bytes) - float64(d.floor)/8*now.Sub(c.at).Seconds()
				c.borrowed += max(over, 0)
				c.bytes, c.at = got, now
			} else {
				c.bytes, c.at = got, now // the share's counters were made again
			}
			ch <- prometheus.MustNewConstMetric(shareBorrowed, prometheus.CounterValue, c.borrowed, l.claim, l.shareID, d.dir.String())
		}
	}
	for k := range p.borrowed {
		if !seen[k] {
			delete(p.borrowed, k)
		}
	}
}

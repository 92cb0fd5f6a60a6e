package netdev_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-dra/carve/bpf/nettest"
)

// A scrape reports the drops of each share's class in both directions:
// the egress class on the parent's egress shaper and the ingress class on
// its IFB, found without listing every link of the node.
func TestShareMetricsFromShapersAndIFBs(t *testing.T) {
	b := newBench(t)
	s := b.add("metered", "10M", "20M", nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.p)
	// dropsOf is what a scrape reports for the share, by direction.
	dropsOf := func() map[string]float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		drops := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "carve_share_drops_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["claim"] == "default/metered" && labels["share_id"] == string(*s.alloc.ShareID) {
					drops[labels["direction"]] = m.GetCounter().GetValue()
				}
			}
		}
		return drops
	}
	drops := dropsOf()
	if _, ok := drops["egress"]; !ok {
		t.Errorf("drops reported for %v, want egress and ingress", drops)
	}
	if _, ok := drops["ingress"]; !ok {
		t.Errorf("drops reported for %v, want egress and ingress", drops)
	}
	// A UDP flood past the egress limit overflows the share's queue: the
	// drops are counted where they happen, in its flow children's queues
	// where it has them.
	if _, err := nettest.RunUDP([]nettest.Flow{{From: s.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":5401"}}, 1400, 0, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	after := dropsOf()
	t.Logf("egress drops after a UDP flood of the 10M share: %.0f", after["egress"]-drops["egress"])
	if after["egress"] <= drops["egress"] {
		t.Errorf("a UDP flood of the share dropped nothing by the metrics: %v, then %v", drops, after)
	}
}

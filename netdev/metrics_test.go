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
	// scrape is what a scrape reports for the share, by direction: its
	// drops and its allocated rate.
	scrape := func() (drops, allocated map[string]float64) {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		drops, allocated = map[string]float64{}, map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				switch {
				case f.GetName() == "carve_share_allocated_bits_per_second":
					allocated[labels["direction"]] = m.GetGauge().GetValue()
				case f.GetName() == "carve_share_drops_total" && labels["claim"] == "default/metered" && labels["share_id"] == string(*s.alloc.ShareID):
					drops[labels["direction"]] = m.GetCounter().GetValue()
				}
			}
		}
		return drops, allocated
	}
	drops, allocated := scrape()
	if allocated["egress"] != 10e6 || allocated["ingress"] != 20e6 {
		t.Errorf("allocated %v, want egress 10M, ingress 20M", allocated)
	}
	for _, dir := range []string{"egress", "ingress"} {
		if _, ok := drops[dir]; !ok {
			t.Errorf("drops reported for %v, want egress and ingress", drops)
		}
	}
	// A UDP flood past the egress limit overflows the share's queue: the
	// drops are counted where they happen, in its flow children's queues
	// where it has them.
	if _, err := nettest.RunUDP([]nettest.Flow{{From: s.pod, To: b.tp.Server, ToAddr: b.tp.ServerIP + ":5401"}}, 1400, 0, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	after, _ := scrape()
	t.Logf("egress drops after a UDP flood of the 10M share: %.0f", after["egress"]-drops["egress"])
	if after["egress"] <= drops["egress"] {
		t.Errorf("a UDP flood of the share dropped nothing by the metrics: %v, then %v", drops, after)
	}
}

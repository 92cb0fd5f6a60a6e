package netdev_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A scrape reports the drops of each share's class in both directions:
// the egress class on the parent's egress shaper and the ingress class on
// its IFB, found without listing every link of the node.
func TestShareMetricsFromShapersAndIFBs(t *testing.T) {
	b := newBench(t)
	s := b.add("metered", "10M", "20M", nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.p)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	drops := map[string]bool{}
	allocated := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "carve_share_allocated_bits_per_second" {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "direction" {
						allocated[l.GetValue()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		if f.GetName() != "carve_share_drops_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["claim"] == "default/metered" && labels["share_id"] == string(*s.alloc.ShareID) {
				drops[labels["direction"]] = true
			}
		}
	}
	if allocated["egress"] != 10e6 || allocated["ingress"] != 20e6 {
		t.Errorf("allocated %v, want egress 10M, ingress 20M", allocated)
	}
	if !drops["egress"] || !drops["ingress"] {
		t.Errorf("drops reported for %v, want egress and ingress", drops)
	}
}

package health

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the health metrics, one series per device.
type Metrics struct {
	// State is 0 (healthy), 1 (degraded) or 2 (lost), with the taint's
	// reason and effect ("" where healthy).
	State *prometheus.GaugeVec
	// Changes counts changes of a device's taint.
	Changes *prometheus.CounterVec
}

// NewMetrics registers the health metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "carve_device_health_state",
			Help: "A device's health: 0 healthy, 1 degraded, 2 lost; reason and effect are its taint's value and effect."},
			[]string{"device", "kind", "reason", "effect"}),
		Changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "carve_device_health_changes_total",
			Help: "Changes of a device's taint: made, reason changed, cleared."}, []string{"device", "kind"}),
	}
	reg.MustRegister(m.State, m.Changes)
	return m
}

// Set records a device's status and its changes since the last Set;
// effect is its taint's, "" where not tainted.
func (m *Metrics) Set(kind string, s Status, effect string, changes int) {
	m.State.DeletePartialMatch(prometheus.Labels{"device": s.Device})
	sev := s.Severity
	if !s.Tainted {
		sev = Healthy
	}
	m.State.WithLabelValues(s.Device, kind, s.Reason, effect).Set(float64(sev))
	m.Changes.WithLabelValues(s.Device, kind).Add(float64(max(changes, 0)))
}

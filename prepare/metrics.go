package prepare

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are carve's own Prometheus metrics. The kubeletplugin gRPC
// histograms are registered beside them by the agent.
type Metrics struct {
	PrepareDuration   *prometheus.HistogramVec
	UnprepareDuration *prometheus.HistogramVec
	PreparedClaims    prometheus.Gauge
	DiscoveryDuration prometheus.Histogram
	PublishErrors     prometheus.Counter
	Publishes         prometheus.Counter
	CorruptCheckpoint prometheus.Counter
	// CheckpointWrite and CheckpointBytes follow the checkpoint's writes:
	// what a prepare and an unprepare pay for it as claims accumulate.
	CheckpointWrite prometheus.Histogram
	CheckpointBytes prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	m := &Metrics{
		PrepareDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "carve_prepare_duration_seconds", Help: "Time to prepare one device of a claim, by device kind and result.", Buckets: buckets,
		}, []string{"kind", "result"}),
		UnprepareDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "carve_unprepare_duration_seconds", Help: "Time to unprepare one device of a claim, by device kind and result.", Buckets: buckets,
		}, []string{"kind", "result"}),
		PreparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_prepared_claims", Help: "Claims currently prepared on this node.",
		}),
		DiscoveryDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_discovery_duration_seconds", Help: "Time to discover the node's hardware.", Buckets: buckets,
		}),
		PublishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_publish_errors_total", Help: "Errors publishing ResourceSlices.",
		}),
		Publishes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_publishes_total", Help: "Times the node's pool was handed to the publisher: at start and when the hardware changed.",
		}),
		CorruptCheckpoint: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_checkpoint_corrupt_total", Help: "Checkpoint files found unreadable and kept aside.",
		}),
		CheckpointWrite: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "carve_checkpoint_write_duration_seconds", Help: "Time to encode and write the checkpoint of prepared claims.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		CheckpointBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_checkpoint_bytes", Help: "Size of the checkpoint of prepared claims at its last write.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.PrepareDuration, m.UnprepareDuration, m.PreparedClaims, m.DiscoveryDuration, m.PublishErrors, m.Publishes, m.CorruptCheckpoint,
			m.CheckpointWrite, m.CheckpointBytes)
	}
	return m
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}

func (m *Metrics) observePrepare(kind string, err error, d time.Duration) {
	m.PrepareDuration.WithLabelValues(kind, result(err)).Observe(d.Seconds())
}

func (m *Metrics) observeUnprepare(kind string, err error, d time.Duration) {
	m.UnprepareDuration.WithLabelValues(kind, result(err)).Observe(d.Seconds())
}

package kubeapi

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/noderun/noderun/crilog"
)

// LogStreams has each scrape report the log collector's count of records
// it could not write (a full disk, say) for each container log, and
// whether it is dropping now. The counts live in the collector and start
// over when it restarts, which Prometheus reads as a counter reset.
func (m *Metrics) LogStreams(streams func(context.Context) ([]crilog.StreamStats, error)) {
	m.reg.MustRegister(logDrops{
		streams: streams,
		dropped: prometheus.NewDesc("noderun_log_dropped_lines_total",
			"Log records (lines, or parts of long lines) the log collector could not write, by container log.", []string{"log_path"}, nil),
		dropping: prometheus.NewDesc("noderun_log_dropping",
			"1 while the log collector cannot write a container's log (its output is being dropped), else 0.", []string{"log_path"}, nil),
	})
}

type logDrops struct {
	streams           func(context.Context) ([]crilog.StreamStats, error)
	dropped, dropping *prometheus.Desc
}

func (l logDrops) Describe(ch chan<- *prometheus.Desc) { ch <- l.dropped; ch <- l.dropping }

// Collect reports nothing while the collector does not answer (it is
// being restarted): a failed scrape would hide every other metric.
func (l logDrops) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	all, err := l.streams(ctx)
	if err != nil {
		return
	}
	for _, s := range all {
		ch <- prometheus.MustNewConstMetric(l.dropped, prometheus.CounterValue, float64(s.Dropped), s.Path)
		dropping := 0.0
		if s.Dropping {
			dropping = 1
		}
		ch <- prometheus.MustNewConstMetric(l.dropping, prometheus.GaugeValue, dropping, s.Path)
	}
}

package podstats

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The kubelet's /metrics/resource series
// (pkg/kubelet/metrics/collectors/resource_metrics.go): names, help and
// labels as it has them.
var (
	nodeCPUDesc = prometheus.NewDesc("node_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the node in core-seconds", nil, nil)
	nodeMemoryDesc = prometheus.NewDesc("node_memory_working_set_bytes",
		"Current working set of the node in bytes", nil, nil)
	containerCPUDesc = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the container in core-seconds", []string{"container", "pod", "namespace"}, nil)
	containerMemoryDesc = prometheus.NewDesc("container_memory_working_set_bytes",
		"Current working set of the container in bytes", []string{"container", "pod", "namespace"}, nil)
	containerSwapDesc = prometheus.NewDesc("container_swap_usage_bytes",
		"Current amount of the container swap usage in bytes. Reported only on non-windows systems", []string{"container", "pod", "namespace"}, nil)
	containerStartDesc = prometheus.NewDesc("container_start_time_seconds",
		"Start time of the container since unix epoch in seconds", []string{"container", "pod", "namespace"}, nil)
	podCPUDesc = prometheus.NewDesc("pod_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the pod in core-seconds", []string{"pod", "namespace"}, nil)
	podMemoryDesc = prometheus.NewDesc("pod_memory_working_set_bytes",
		"Current working set of the pod in bytes", []string{"pod", "namespace"}, nil)
	podSwapDesc = prometheus.NewDesc("pod_swap_usage_bytes",
		"Current amount of the pod swap usage in bytes. Reported only on non-windows systems", []string{"pod", "namespace"}, nil)
	scrapeErrorDesc = prometheus.NewDesc("scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil)
	resourceScrapeErrorDesc = prometheus.NewDesc("resource_scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil)
)

// ResourceMetrics is the kubelet's /metrics/resource from the latest
// collection (when collecting fails, only its scrape error series, set).
func (c *Collector) ResourceMetrics(ctx context.Context) prometheus.Collector {
	s, err := c.Snapshot(ctx)
	return resourceMetrics{s, err}
}

type resourceMetrics struct {
	s   *Snapshot
	err error
}

// Describe sends nothing: the collector is unchecked, as its series come
// and go with containers.
func (resourceMetrics) Describe(chan<- *prometheus.Desc) {}

func (r resourceMetrics) Collect(ch chan<- prometheus.Metric) {
	failed := 0.0
	if r.err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrorDesc, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(resourceScrapeErrorDesc, prometheus.GaugeValue, failed)
	if r.s == nil {
		return
	}
	at := r.s.At
	send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.NewMetricWithTimestamp(at, prometheus.MustNewConstMetric(d, t, v, labels...))
	}
	send(nodeCPUDesc, prometheus.CounterValue, seconds(r.s.Node.CPU))
	send(nodeMemoryDesc, prometheus.GaugeValue, float64(r.s.Node.WorkingSet))
	for _, p := range r.s.Pods {
		for _, c := range p.Containers {
			if !c.Container.StartTime.IsZero() {
				ch <- prometheus.MustNewConstMetric(containerStartDesc, prometheus.GaugeValue,
					float64(c.Container.StartTime.UnixNano())/1e9, c.Container.Name, p.Pod.Name, p.Pod.Namespace)
			}
			send(containerCPUDesc, prometheus.CounterValue, seconds(c.Usage.CPU), c.Container.Name, p.Pod.Name, p.Pod.Namespace)
			send(containerMemoryDesc, prometheus.GaugeValue, float64(c.Usage.WorkingSet), c.Container.Name, p.Pod.Name, p.Pod.Namespace)
			send(containerSwapDesc, prometheus.GaugeValue, float64(c.Usage.Swap), c.Container.Name, p.Pod.Name, p.Pod.Namespace)
		}
		if u := p.Usage; u != nil {
			send(podCPUDesc, prometheus.CounterValue, seconds(u.CPU), p.Pod.Name, p.Pod.Namespace)
			send(podMemoryDesc, prometheus.GaugeValue, float64(u.WorkingSet), p.Pod.Name, p.Pod.Namespace)
			send(podSwapDesc, prometheus.GaugeValue, float64(u.Swap), p.Pod.Name, p.Pod.Namespace)
		}
	}
}

func seconds(nanos uint64) float64 { return float64(nanos) / float64(time.Second) }

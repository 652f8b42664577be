package podstats

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// desc is a series family's name, help and labels.
type desc struct {
	name, help string
	labels     []string
}

// descs makes the families of a table: a loop over static data, which
// costs the binary less than a call per family.
func descs(specs []desc) []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(specs))
	for i, d := range specs {
		out[i] = prometheus.NewDesc(d.name, d.help, d.labels, nil)
	}
	return out
}

var (
	containerLabels = []string{"container", "pod", "namespace"}
	podLabels       = []string{"pod", "namespace"}
)

// The kubelet's /metrics/resource series
// (pkg/kubelet/metrics/collectors/resource_metrics.go): names, help and
// labels as it has them, in the order of resourceSpecs.
const (
	nodeCPU = iota
	nodeMemory
	containerCPU
	containerMemory
	containerSwap
	containerStart
	podCPU
	podMemory
	podSwap
	scrapeError
	resourceScrapeError
)

var resourceDescs = descs([]desc{
	{"node_cpu_usage_seconds_total", "Cumulative cpu time consumed by the node in core-seconds", nil},
	{"node_memory_working_set_bytes", "Current working set of the node in bytes", nil},
	{"container_cpu_usage_seconds_total", "Cumulative cpu time consumed by the container in core-seconds", containerLabels},
	{"container_memory_working_set_bytes", "Current working set of the container in bytes", containerLabels},
	{"container_swap_usage_bytes", "Current amount of the container swap usage in bytes. Reported only on non-windows systems", containerLabels},
	{"container_start_time_seconds", "Start time of the container since unix epoch in seconds", containerLabels},
	{"pod_cpu_usage_seconds_total", "Cumulative cpu time consumed by the pod in core-seconds", podLabels},
	{"pod_memory_working_set_bytes", "Current working set of the pod in bytes", podLabels},
	{"pod_swap_usage_bytes", "Current amount of the pod swap usage in bytes. Reported only on non-windows systems", podLabels},
	{"scrape_error", "1 if there was an error while getting container metrics, 0 otherwise", nil},
	{"resource_scrape_error", "1 if there was an error while getting container metrics, 0 otherwise", nil},
})

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
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(resourceDescs[scrapeError], gauge, failed)
	ch <- prometheus.MustNewConstMetric(resourceDescs[resourceScrapeError], gauge, failed)
	if r.s == nil {
		return
	}
	send := func(d int, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.NewMetricWithTimestamp(r.s.At, prometheus.MustNewConstMetric(resourceDescs[d], t, v, labels...))
	}
	send(nodeCPU, counter, seconds(r.s.Node.CPU))
	send(nodeMemory, gauge, float64(r.s.Node.WorkingSet))
	for _, p := range r.s.Pods {
		for _, c := range p.Containers {
			l := []string{c.Container.Name, p.Pod.Name, p.Pod.Namespace}
			if !c.Container.StartTime.IsZero() {
				ch <- prometheus.MustNewConstMetric(resourceDescs[containerStart], gauge, float64(c.Container.StartTime.UnixNano())/1e9, l...)
			}
			send(containerCPU, counter, seconds(c.Usage.CPU), l...)
			send(containerMemory, gauge, float64(c.Usage.WorkingSet), l...)
			send(containerSwap, gauge, float64(c.Usage.Swap), l...)
		}
		if u := p.Usage; u != nil {
			send(podCPU, counter, seconds(u.CPU), p.Pod.Name, p.Pod.Namespace)
			send(podMemory, gauge, float64(u.WorkingSet), p.Pod.Name, p.Pod.Namespace)
			send(podSwap, gauge, float64(u.Swap), p.Pod.Name, p.Pod.Namespace)
		}
	}
}

func seconds(nanos uint64) float64 { return float64(nanos) / float64(time.Second) }

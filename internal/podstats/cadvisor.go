package podstats

import (
	"context"

	"github.com/noderun/noderun/internal/cgroups"
	"github.com/prometheus/client_golang/prometheus"
)

// cadvisorLabels are the labels the kubelet gives every cAdvisor series
// (containerPrometheusLabelsFunc in pkg/kubelet/server/server.go): the
// cgroup (id), the runtime's container ID (name), the image, and the
// Kubernetes names; the pod's own cgroup has no container, the node's
// root ("/") none of them.
var cadvisorLabels = []string{"container", "id", "image", "name", "namespace", "pod"}

// cadvisorMetric is one cAdvisor series family, from a cgroup's usage.
type cadvisorMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(u *cgroups.Usage) float64
	extra []string // values of the family's extra labels
}

func cadvisorDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(append([]string(nil), cadvisorLabels...), extra...), nil)
}

// cadvisorMetrics are cAdvisor's names and help (metrics/prometheus.go)
// for what a cgroup tells; network, start time and pressure are below.
var cadvisorMetrics = []cadvisorMetric{
	{cadvisorDesc("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", "cpu"),
		prometheus.CounterValue, func(u *cgroups.Usage) float64 { return seconds(u.CPU) }, []string{"total"}},
	{cadvisorDesc("container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds."),
		prometheus.CounterValue, func(u *cgroups.Usage) float64 { return seconds(u.CPUUser) }, nil},
	{cadvisorDesc("container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds."),
		prometheus.CounterValue, func(u *cgroups.Usage) float64 { return seconds(u.CPUSystem) }, nil},
	{cadvisorDesc("container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed"),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.Memory) }, nil},
	{cadvisorDesc("container_memory_working_set_bytes", "Current working set in bytes."),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.WorkingSet) }, nil},
	{cadvisorDesc("container_memory_rss", "Size of RSS in bytes."),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.RSS) }, nil},
	{cadvisorDesc("container_memory_cache", "Number of bytes of page cache memory."),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.Cache) }, nil},
	{cadvisorDesc("container_memory_swap", "Container swap usage in bytes."),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.Swap) }, nil},
	{cadvisorDesc("container_spec_memory_limit_bytes", "Memory limit for the container."),
		prometheus.GaugeValue, func(u *cgroups.Usage) float64 { return float64(u.MemoryLimit) }, nil},
}

var (
	failuresDesc = cadvisorDesc("container_memory_failures_total", "Cumulative count of memory allocation failures.", "failure_type", "scope")
	startDesc    = cadvisorDesc("container_start_time_seconds", "Start time of the container since unix epoch in seconds.")
	netDescs     = []*prometheus.Desc{
		cadvisorDesc("container_network_receive_bytes_total", "Cumulative count of bytes received", "interface"),
		cadvisorDesc("container_network_receive_packets_total", "Cumulative count of packets received", "interface"),
		cadvisorDesc("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", "interface"),
		cadvisorDesc("container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", "interface"),
		cadvisorDesc("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", "interface"),
		cadvisorDesc("container_network_transmit_packets_total", "Cumulative count of packets transmitted", "interface"),
		cadvisorDesc("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", "interface"),
		cadvisorDesc("container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting", "interface"),
	}
	// pressureDescs: stalled is PSI's "full" line, waiting its "some".
	pressureDescs = map[string][2]*prometheus.Desc{
		"cpu": {cadvisorDesc("container_pressure_cpu_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to CPU congestion."),
			cadvisorDesc("container_pressure_cpu_waiting_seconds_total", "Total time duration tasks in the container have waited due to CPU congestion.")},
		"memory": {cadvisorDesc("container_pressure_memory_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to memory congestion."),
			cadvisorDesc("container_pressure_memory_waiting_seconds_total", "Total time duration tasks in the container have waited due to memory congestion.")},
		"io": {cadvisorDesc("container_pressure_io_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to IO congestion."),
			cadvisorDesc("container_pressure_io_waiting_seconds_total", "Total time duration tasks in the container have waited due to IO congestion.")},
	}
	containerScrapeErrorDesc = prometheus.NewDesc("container_scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil)
)

// CadvisorMetrics is the kubelet's /metrics/cadvisor from the latest
// collection: the node's root cgroup, each pod's and each running
// container's.
func (c *Collector) CadvisorMetrics(ctx context.Context) prometheus.Collector {
	s, err := c.Snapshot(ctx)
	return cadvisor{s, err, c.cfg.Cgroups}
}

type cadvisor struct {
	s   *Snapshot
	err error
	cg  cgroups.Layout
}

// Describe sends nothing: the collector is unchecked.
func (cadvisor) Describe(chan<- *prometheus.Desc) {}

func (c cadvisor) Collect(ch chan<- prometheus.Metric) {
	failed := 0.0
	if c.err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(containerScrapeErrorDesc, prometheus.GaugeValue, failed)
	if c.s == nil {
		return
	}
	c.cgroup(ch, &c.s.Node, []string{"", "/", "", "", "", ""}, nil)
	for _, p := range c.s.Pods {
		if p.Usage != nil {
			c.cgroup(ch, p.Usage, []string{"", c.cg.Path(p.Pod.Cgroup), "", "", p.Pod.Namespace, p.Pod.Name}, p.Network)
		}
		for _, ct := range p.Containers {
			labels := []string{ct.Container.Name, c.cg.Path(ct.Container.Cgroup), ct.Container.Image, ct.Container.ID, p.Pod.Namespace, p.Pod.Name}
			c.cgroup(ch, &ct.Usage, labels, nil)
			if !ct.Container.StartTime.IsZero() {
				ch <- prometheus.MustNewConstMetric(startDesc, prometheus.GaugeValue, float64(ct.Container.StartTime.UnixNano())/1e9, labels...)
			}
		}
	}
}

// cgroup sends one cgroup's series with its labels.
func (c cadvisor) cgroup(ch chan<- prometheus.Metric, u *cgroups.Usage, labels []string, net []Interface) {
	send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, extra ...string) {
		m := prometheus.MustNewConstMetric(d, t, v, append(append([]string(nil), labels...), extra...)...)
		ch <- prometheus.NewMetricWithTimestamp(c.s.At, m)
	}
	for _, m := range cadvisorMetrics {
		send(m.desc, m.typ, m.value(u), m.extra...)
	}
	send(failuresDesc, prometheus.CounterValue, float64(u.PageFaults), "pgfault", "hierarchy")
	send(failuresDesc, prometheus.CounterValue, float64(u.MajorPageFaults), "pgmajfault", "hierarchy")
	for _, i := range net {
		for j, v := range []uint64{i.RxBytes, i.RxPackets, i.RxErrors, i.RxDropped, i.TxBytes, i.TxPackets, i.TxErrors, i.TxDropped} {
			send(netDescs[j], prometheus.CounterValue, float64(v), i.Name)
		}
	}
	for kind, p := range map[string]*cgroups.Pressure{"cpu": u.CPUPressure, "memory": u.MemoryPressure, "io": u.IOPressure} {
		if p != nil { // PSI totals are in microseconds
			send(pressureDescs[kind][0], prometheus.CounterValue, float64(p.Full.Total)/1e6)
			send(pressureDescs[kind][1], prometheus.CounterValue, float64(p.Some.Total)/1e6)
		}
	}
}

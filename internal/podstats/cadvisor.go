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

// cadvisorDescs are cAdvisor's names and help (metrics/prometheus.go),
// the families a cgroup's usage gives first, in the order of cgroupValues;
// then the memory failures, the start time, network (8, in the order of
// Interface's counters), pressure (stalled then waiting, per resource)
// and the scrape error.
var cadvisorDescs = func() []*prometheus.Desc {
	specs := []desc{
		{"container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", []string{"cpu"}},
		{"container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", nil},
		{"container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", nil},
		{"container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed", nil},
		{"container_memory_working_set_bytes", "Current working set in bytes.", nil},
		{"container_memory_rss", "Size of RSS in bytes.", nil},
		{"container_memory_cache", "Number of bytes of page cache memory.", nil},
		{"container_memory_swap", "Container swap usage in bytes.", nil},
		{"container_spec_memory_limit_bytes", "Memory limit for the container.", nil},
		{"container_memory_failures_total", "Cumulative count of memory allocation failures.", []string{"failure_type", "scope"}},
		{"container_start_time_seconds", "Start time of the container since unix epoch in seconds.", nil},
		{"container_network_receive_bytes_total", "Cumulative count of bytes received", []string{"interface"}},
		{"container_network_receive_packets_total", "Cumulative count of packets received", []string{"interface"}},
		{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", []string{"interface"}},
		{"container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", []string{"interface"}},
		{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", []string{"interface"}},
		{"container_network_transmit_packets_total", "Cumulative count of packets transmitted", []string{"interface"}},
		{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", []string{"interface"}},
		{"container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting", []string{"interface"}},
		{"container_pressure_cpu_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to CPU congestion.", nil},
		{"container_pressure_cpu_waiting_seconds_total", "Total time duration tasks in the container have waited due to CPU congestion.", nil},
		{"container_pressure_memory_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to memory congestion.", nil},
		{"container_pressure_memory_waiting_seconds_total", "Total time duration tasks in the container have waited due to memory congestion.", nil},
		{"container_pressure_io_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to IO congestion.", nil},
		{"container_pressure_io_waiting_seconds_total", "Total time duration tasks in the container have waited due to IO congestion.", nil},
	}
	for i := range specs {
		specs[i].labels = append(append([]string(nil), cadvisorLabels...), specs[i].labels...)
	}
	return append(descs(specs), prometheus.NewDesc("container_scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil))
}()

// Where the families after cgroupValues' are in cadvisorDescs.
const (
	failuresFamily = 9 + iota
	startFamily
	networkFamily
	pressureFamily = networkFamily + 8
	scrapeFamily   = pressureFamily + 6
)

// cgroupValues are the first families' values, from a cgroup's usage;
// all but the CPU time counters are gauges.
var cgroupValues = []func(u *cgroups.Usage) float64{
	func(u *cgroups.Usage) float64 { return seconds(u.CPU) },
	func(u *cgroups.Usage) float64 { return seconds(u.CPUUser) },
	func(u *cgroups.Usage) float64 { return seconds(u.CPUSystem) },
	func(u *cgroups.Usage) float64 { return float64(u.Memory) },
	func(u *cgroups.Usage) float64 { return float64(u.WorkingSet) },
	func(u *cgroups.Usage) float64 { return float64(u.RSS) },
	func(u *cgroups.Usage) float64 { return float64(u.Cache) },
	func(u *cgroups.Usage) float64 { return float64(u.Swap) },
	func(u *cgroups.Usage) float64 { return float64(u.MemoryLimit) },
}

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
	ch <- prometheus.MustNewConstMetric(cadvisorDescs[scrapeFamily], prometheus.GaugeValue, failed)
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
				ch <- prometheus.MustNewConstMetric(cadvisorDescs[startFamily], prometheus.GaugeValue, float64(ct.Container.StartTime.UnixNano())/1e9, labels...)
			}
		}
	}
}

// cgroup sends one cgroup's series with its labels.
func (c cadvisor) cgroup(ch chan<- prometheus.Metric, u *cgroups.Usage, labels []string, net []Interface) {
	send := func(family int, t prometheus.ValueType, v float64, extra ...string) {
		m := prometheus.MustNewConstMetric(cadvisorDescs[family], t, v, append(labels[:len(labels):len(labels)], extra...)...)
		ch <- prometheus.NewMetricWithTimestamp(c.s.At, m)
	}
	counter := prometheus.CounterValue
	send(0, counter, cgroupValues[0](u), "total") // cpu="total": the kubelet reads no per-CPU usage
	for i := 1; i < len(cgroupValues); i++ {
		t := prometheus.GaugeValue
		if i < 3 {
			t = counter
		}
		send(i, t, cgroupValues[i](u))
	}
	send(failuresFamily, counter, float64(u.PageFaults), "pgfault", "hierarchy")
	send(failuresFamily, counter, float64(u.MajorPageFaults), "pgmajfault", "hierarchy")
	for _, i := range net {
		for j, v := range []uint64{i.RxBytes, i.RxPackets, i.RxErrors, i.RxDropped, i.TxBytes, i.TxPackets, i.TxErrors, i.TxDropped} {
			send(networkFamily+j, counter, float64(v), i.Name)
		}
	}
	for j, p := range []*cgroups.Pressure{u.CPUPressure, u.MemoryPressure, u.IOPressure} {
		if p != nil { // PSI totals are in microseconds; stalled is "full", waiting "some"
			send(pressureFamily+2*j, counter, float64(p.Full.Total)/1e6)
			send(pressureFamily+2*j+1, counter, float64(p.Some.Total)/1e6)
		}
	}
}

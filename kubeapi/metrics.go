package kubeapi

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Metrics are noderun's Prometheus metrics, in a registry of its own (not
// the global one), with the kubelet's names where the kubelet has one.
// The engine feeds it through runner.Metrics; pod and container counts
// are read from the backend at each scrape.
type Metrics struct {
	reg        *prometheus.Registry
	probes     *prometheus.CounterVec
	opDuration *prometheus.HistogramVec
	opErrors   *prometheus.CounterVec
	podStart   prometheus.Histogram
	pulls      *prometheus.CounterVec
	mirror     *prometheus.CounterVec
}

// NewMetrics makes the registry with Go and process metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "prober", Name: "probe_total",
			Help: "Cumulative number of a liveness, readiness or startup probe for a container by result.",
		}, []string{"probe_type", "result", "container", "pod", "namespace", "pod_uid"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "runtime_operations_duration_seconds",
			Help:    "Duration in seconds of runtime operations. Broken down by operation type.",
			Buckets: prometheus.ExponentialBuckets(.005, 2.5, 14),
		}, []string{"operation_type"}),
		opErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "runtime_operations_errors_total",
			Help: "Cumulative number of runtime operation errors by operation type.",
		}, []string{"operation_type"}),
		podStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "pod_start_duration_seconds",
			Help:    "Duration in seconds from noderun seeing a pod for the first time to the pod starting to run",
			Buckets: []float64{0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600},
		}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "noderun", Name: "image_pulls_total",
			Help: "Image pulls (images made available for containers, from a registry or found locally) by result.",
		}, []string{"result"}),
		mirror: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "noderun", Name: "mirror_requests_total",
			Help: "Calls mirror mode made to the API server (--kubeconfig) by operation and result.",
		}, []string{"operation", "result"}),
	}
	m.reg.MustRegister(m.probes, m.opDuration, m.opErrors, m.podStart, m.pulls, m.mirror,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ProbeResult counts one probe attempt; result is the kubelet's:
// successful, failed or unknown (the attempt could not be made). A result
// without a pod name is from a worker that stopped with its pod, which the
// engine no longer knows: its series would never be deleted.
func (m *Metrics) ProbeResult(probeType, result, container, pod, namespace, podUID string) {
	if pod == "" {
		return
	}
	m.probes.WithLabelValues(probeType, result, container, pod, namespace, podUID).Inc()
}

// RuntimeOperation records one call to containerd under the kubelet's
// operation_type names.
func (m *Metrics) RuntimeOperation(op string, d time.Duration, err error) {
	m.opDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.opErrors.WithLabelValues(op).Inc()
	}
}

// ImagePull counts making an image available for a container.
func (m *Metrics) ImagePull(err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.pulls.WithLabelValues(result).Inc()
}

// MirrorCall counts one call mirror mode made to the API server.
func (m *Metrics) MirrorCall(op string, err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.mirror.WithLabelValues(op, result).Inc()
}

// observePod follows a pod's changes. It times the pod's start: from when
// it was first seen to the change that shows it Running. Pods already
// running when noderun starts (adopted) make no change, so they are not
// timed.
func (m *Metrics) observePod(c change[v1.Pod], now time.Time) {
	// A pod's probe series go when its probe workers stop, as the
	// kubelet's do: once it ended or went. Every manifest edit is a new
	// UID, so kept series would grow with churn for good.
	if c.typ == watch.Deleted || c.obj.Status.Phase == v1.PodSucceeded || c.obj.Status.Phase == v1.PodFailed {
		m.probes.DeletePartialMatch(prometheus.Labels{"pod_uid": string(c.obj.UID)})
	}
	started := c.obj.Status.Phase == v1.PodRunning &&
		(c.typ == watch.Added || c.typ == watch.Modified && c.prev.Status.Phase != v1.PodRunning)
	if started {
		m.podStart.Observe(now.Sub(c.obj.CreationTimestamp.Time).Seconds())
	}
}

// stateCollector reads pods, containers and manifest errors from the
// backend at scrape time.
type stateCollector struct{ s *Server }

var (
	runningPodsDesc = prometheus.NewDesc("kubelet_running_pods",
		"Number of pods that have a running pod sandbox", nil, nil)
	runningContainersDesc = prometheus.NewDesc("kubelet_running_containers",
		"Number of containers currently running", []string{"container_state"}, nil)
	sourceErrorsDesc = prometheus.NewDesc("noderun_manifest_source_errors",
		"Manifest errors a source reports now (files or documents that define no pod)", []string{"source"}, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runningPodsDesc
	ch <- runningContainersDesc
	ch <- sourceErrorsDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.backend.Load() == nil {
		return
	}
	pods := c.s.be().Pods()
	running := 0
	states := map[string]int{"running": 0, "exited": 0, "created": 0, "unknown": 0}
	for i := range pods {
		p := &pods[i]
		if sandboxRunning(p) {
			running++
		}
		for _, cs := range append(append([]v1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			switch {
			case cs.State.Running != nil:
				states["running"]++
			case cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil:
				states["exited"]++ // a container in back-off is its exited last run
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(runningPodsDesc, prometheus.GaugeValue, float64(running))
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(runningContainersDesc, prometheus.GaugeValue, float64(n), state)
	}
	for source, errs := range c.s.be().SourceErrors() {
		ch <- prometheus.MustNewConstMetric(sourceErrorsDesc, prometheus.GaugeValue, float64(len(errs)), source)
	}
}

// sandboxRunning: the pod's sandbox is up (PodReadyToStartContainers, set
// once the network is there) and the pod has not ended.
func sandboxRunning(p *v1.Pod) bool {
	if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return false
	}
	return podConditionTrue(p, v1.PodReadyToStartContainers) || p.Status.Phase == v1.PodRunning
}

// Metrics returns the metrics the server serves (WithMetrics), for the
// engine to feed.
func (s *Server) Metrics() *Metrics { return s.metrics }

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

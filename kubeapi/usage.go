package kubeapi

import (
	"context"
	"net/http"

	"github.com/noderun/noderun/internal/podstats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	v1 "k8s.io/api/core/v1"
	qty "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Usage is the node's resource usage, read on request: the Metrics API
// (kubectl top), the kubelet's /stats/summary, /metrics/resource and
// /metrics/cadvisor are served from it.
type Usage interface {
	Snapshot(ctx context.Context) (*podstats.Snapshot, error)
	ResourceMetrics(ctx context.Context) prometheus.Collector
	CadvisorMetrics(ctx context.Context) prometheus.Collector
}

// ServeUsage serves u's endpoints from then on (call it before Ready:
// discovery lists the Metrics API only while it is served).
func (s *Server) ServeUsage(u Usage) { s.usage.Store(&u) }

func (s *Server) usageOf(w http.ResponseWriter) Usage {
	u := s.usage.Load()
	if u == nil {
		writeStatus(w, notFoundMsg("the server could not find the requested resource"))
		return nil
	}
	return *u
}

const metricsGroup, metricsVersion = "metrics.k8s.io", "v1beta1"

// usageRoutes adds the Metrics API, as metrics-server serves it, and the
// kubelet's usage endpoints, both at the kubelet's own paths and through
// the node proxy paths a Prometheus scrape through an API server uses.
func (s *Server) usageRoutes(mux *http.ServeMux) {
	const api = "/apis/" + metricsGroup + "/" + metricsVersion
	mux.HandleFunc("GET /apis/"+metricsGroup, s.serveMetricsGroup)
	mux.HandleFunc("GET "+api, s.serveMetricsResources)
	mux.HandleFunc("GET "+api+"/nodes", s.serveNodeMetrics)
	mux.HandleFunc("GET "+api+"/nodes/{name}", s.serveNodeMetrics)
	mux.HandleFunc("GET "+api+"/pods", s.servePodMetrics)
	mux.HandleFunc("GET "+api+"/namespaces/{namespace}/pods", s.servePodMetrics)
	mux.HandleFunc("GET "+api+"/namespaces/{namespace}/pods/{name}", s.servePodMetrics)
	for _, prefix := range []string{"", "/api/v1/nodes/{node}/proxy"} {
		mux.HandleFunc("GET "+prefix+"/stats/summary", s.serveSummary)
		mux.HandleFunc("GET "+prefix+"/metrics/resource", s.serveUsageMetrics(Usage.ResourceMetrics))
		mux.HandleFunc("GET "+prefix+"/metrics/cadvisor", s.serveUsageMetrics(Usage.CadvisorMetrics))
	}
}

// nodeProxied refuses a node proxy path naming another node.
func (s *Server) nodeProxied(w http.ResponseWriter, r *http.Request) bool {
	if n := r.PathValue("node"); n != "" && n != s.be().Node(r.Context()).Name {
		writeStatus(w, notFound("nodes", n))
		return false
	}
	return true
}

func (s *Server) serveSummary(w http.ResponseWriter, r *http.Request) {
	u := s.usageOf(w)
	if u == nil || !s.nodeProxied(w, r) {
		return
	}
	snap, err := u.Snapshot(r.Context())
	if err != nil {
		writeStatus(w, internalError("read usage: "+err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, &snap.Summary)
}

func (s *Server) serveUsageMetrics(collector func(Usage, context.Context) prometheus.Collector) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u := s.usageOf(w)
		if u == nil || !s.nodeProxied(w, r) {
			return
		}
		reg := prometheus.NewRegistry() // one a request: the series are this collection's
		reg.MustRegister(collector(u, r.Context()))
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}
}

// metricsDiscovery is the Metrics API in /apis, when it is served.
func (s *Server) metricsDiscovery() ([]metav1.APIGroup, []apidiscoveryv2.APIGroupDiscovery) {
	if s.usage.Load() == nil {
		return []metav1.APIGroup{}, []apidiscoveryv2.APIGroupDiscovery{}
	}
	gv := metav1.GroupVersionForDiscovery{GroupVersion: metricsGroup + "/" + metricsVersion, Version: metricsVersion}
	var resources []apidiscoveryv2.APIResourceDiscovery
	for _, r := range metricsResources {
		scope := apidiscoveryv2.ScopeCluster
		if r.Namespaced {
			scope = apidiscoveryv2.ScopeNamespace
		}
		resources = append(resources, apidiscoveryv2.APIResourceDiscovery{Resource: r.Name, SingularResource: r.SingularName,
			ResponseKind: &metav1.GroupVersionKind{Group: metricsGroup, Version: metricsVersion, Kind: r.Kind},
			Scope:        scope, Verbs: r.Verbs})
	}
	return []metav1.APIGroup{{Name: metricsGroup, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}},
		[]apidiscoveryv2.APIGroupDiscovery{{
			ObjectMeta: metav1.ObjectMeta{Name: metricsGroup},
			Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: metricsVersion, Resources: resources,
				Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent}},
		}}
}

// metricsResources are metrics-server's resources.
var metricsResources = []metav1.APIResource{
	{Name: "nodes", Kind: "NodeMetrics", Verbs: metav1.Verbs{"get", "list"}},
	{Name: "pods", Namespaced: true, Kind: "PodMetrics", Verbs: metav1.Verbs{"get", "list"}},
}

func (s *Server) serveMetricsGroup(w http.ResponseWriter, _ *http.Request) {
	groups, _ := s.metricsDiscovery()
	if len(groups) == 0 {
		writeStatus(w, notFoundMsg("the server could not find the requested resource"))
		return
	}
	g := groups[0]
	g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
	writeJSON(w, http.StatusOK, &g)
}

func (s *Server) serveMetricsResources(w http.ResponseWriter, _ *http.Request) {
	if s.usage.Load() == nil {
		writeStatus(w, notFoundMsg("the server could not find the requested resource"))
		return
	}
	writeJSON(w, http.StatusOK, &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: metricsGroup + "/" + metricsVersion, APIResources: metricsResources,
	})
}

// The Metrics API's objects (k8s.io/metrics/pkg/apis/metrics/v1beta1),
// local for the same reason as podstats' Summary: a few fields.
type (
	podMetrics struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata,omitempty"`
		Timestamp         metav1.Time        `json:"timestamp"`
		Window            metav1.Duration    `json:"window"`
		Containers        []containerMetrics `json:"containers"`
	}
	containerMetrics struct {
		Name  string          `json:"name"`
		Usage v1.ResourceList `json:"usage"`
	}
	nodeMetrics struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata,omitempty"`
		Timestamp         metav1.Time     `json:"timestamp"`
		Window            metav1.Duration `json:"window"`
		Usage             v1.ResourceList `json:"usage"`
	}
	metricsList struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata"`
		Items           []any `json:"items"`
	}
)

// usageList is the CPU rate in nanocores and the working set, as
// metrics-server reports them.
func usageList(nanoCores *uint64, workingSet *uint64) v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    *qty.NewScaledQuantity(int64(*nanoCores), qty.Nano),
		v1.ResourceMemory: *qty.NewQuantity(int64(*workingSet), qty.BinarySI),
	}
}

// metricsQuery reads a Metrics API request: the usage and the label
// selector, or false once it has answered.
func (s *Server) metricsQuery(w http.ResponseWriter, r *http.Request) (*podstats.Snapshot, labels.Selector, bool) {
	u := s.usageOf(w)
	if u == nil {
		return nil, nil, false
	}
	sel := labels.Everything()
	if q := r.URL.Query().Get("labelSelector"); q != "" {
		var err error
		if sel, err = labels.Parse(q); err != nil {
			writeStatus(w, badRequest("unable to parse requirement: "+err.Error()))
			return nil, nil, false
		}
	}
	snap, err := u.Snapshot(r.Context())
	if err != nil {
		writeStatus(w, internalError("read usage: "+err.Error()))
		return nil, nil, false
	}
	return snap, sel, true
}

func (s *Server) serveNodeMetrics(w http.ResponseWriter, r *http.Request) {
	snap, sel, ok := s.metricsQuery(w, r)
	if !ok {
		return
	}
	node := s.be().Node(r.Context())
	name := r.PathValue("name")
	n := snap.Summary.Node
	var items []any
	if n.CPU.UsageNanoCores != nil && sel.Matches(labels.Set(node.Labels)) && (name == "" || name == node.Name) {
		items = append(items, &nodeMetrics{
			TypeMeta:   metav1.TypeMeta{Kind: "NodeMetrics", APIVersion: metricsGroup + "/" + metricsVersion},
			ObjectMeta: metav1.ObjectMeta{Name: node.Name, Labels: node.Labels, CreationTimestamp: metav1.NewTime(snap.At)},
			Timestamp:  metav1.NewTime(snap.At), Window: metav1.Duration{Duration: snap.NodeWindow},
			Usage: usageList(n.CPU.UsageNanoCores, n.Memory.WorkingSetBytes),
		})
	}
	writeMetrics(w, name, "nodes", items, &metricsList{TypeMeta: metav1.TypeMeta{Kind: "NodeMetricsList"}})
}

// writeMetrics answers a get of name with its item (NotFound when there
// is none) and a list with all of them.
func writeMetrics(w http.ResponseWriter, name, resource string, items []any, list *metricsList) {
	if name == "" {
		list.TypeMeta.APIVersion, list.Items = metricsGroup+"/"+metricsVersion, append([]any{}, items...)
		writeJSON(w, http.StatusOK, list)
		return
	}
	if len(items) == 0 {
		writeStatus(w, notFound(resource+"."+metricsGroup, name))
		return
	}
	writeJSON(w, http.StatusOK, items[0])
}

// servePodMetrics lists or gets pods' usage. A pod is listed once each of
// its running containers has a CPU rate, as metrics-server lists a pod
// once it has two samples of it.
func (s *Server) servePodMetrics(w http.ResponseWriter, r *http.Request) {
	snap, sel, ok := s.metricsQuery(w, r)
	if !ok {
		return
	}
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	podLabels := map[string]map[string]string{}
	for _, p := range s.be().Pods() {
		podLabels[string(p.UID)] = p.Labels
	}
	var items []any
	for i, ps := range snap.Summary.Pods {
		ref := ps.PodRef
		lbls, known := podLabels[ref.UID]
		if !known || ns != "" && ref.Namespace != ns || name != "" && ref.Name != name || !sel.Matches(labels.Set(lbls)) {
			continue
		}
		if pm, ok := podMetricsOf(snap, i, lbls); ok {
			items = append(items, &pm)
		}
	}
	writeMetrics(w, name, "pods", items, &metricsList{TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList"}})
}

// podMetricsOf is the i-th pod of snap as PodMetrics; false while a
// container has no rate yet, or the pod no running container.
func podMetricsOf(snap *podstats.Snapshot, i int, lbls map[string]string) (podMetrics, bool) {
	ps, sample := snap.Summary.Pods[i], snap.Pods[i]
	if len(ps.Containers) == 0 {
		return podMetrics{}, false
	}
	pm := podMetrics{
		TypeMeta:   metav1.TypeMeta{Kind: "PodMetrics", APIVersion: metricsGroup + "/" + metricsVersion},
		ObjectMeta: metav1.ObjectMeta{Name: ps.PodRef.Name, Namespace: ps.PodRef.Namespace, Labels: lbls, CreationTimestamp: metav1.NewTime(snap.At)},
		Timestamp:  metav1.NewTime(snap.At),
	}
	for j, c := range ps.Containers {
		if c.CPU.UsageNanoCores == nil {
			return podMetrics{}, false
		}
		pm.Window = metav1.Duration{Duration: max(pm.Window.Duration, sample.Containers[j].Window)}
		pm.Containers = append(pm.Containers, containerMetrics{Name: c.Name, Usage: usageList(c.CPU.UsageNanoCores, c.Memory.WorkingSetBytes)})
	}
	return pm, true
}

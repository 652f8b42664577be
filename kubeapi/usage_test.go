package kubeapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/podstats"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeUsage is one collection: web-e2e with a rate, new-e2e without yet.
type fakeUsage struct{ snap *podstats.Snapshot }

func (f fakeUsage) Snapshot(context.Context) (*podstats.Snapshot, error) { return f.snap, nil }
func (f fakeUsage) ResourceMetrics(context.Context) prometheus.Collector {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "resource_scrape_error"})
}
func (f fakeUsage) CadvisorMetrics(context.Context) prometheus.Collector {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "container_scrape_error"})
}

func u64(v uint64) *uint64 { return &v }

func newUsageServer(t *testing.T) *Server {
	t.Helper()
	at := time.Unix(5000, 0)
	container := func(name string, rate *uint64) podstats.ContainerStats {
		return podstats.ContainerStats{Name: name, CPU: &podstats.CPUStats{UsageNanoCores: rate}, Memory: &podstats.MemoryStats{WorkingSetBytes: u64(64 << 20)}}
	}
	snap := &podstats.Snapshot{At: at, NodeWindow: 10 * time.Second,
		Summary: podstats.Summary{
			Node: podstats.NodeStats{NodeName: "node1", CPU: &podstats.CPUStats{UsageNanoCores: u64(250e6)}, Memory: &podstats.MemoryStats{WorkingSetBytes: u64(1 << 30)}},
			Pods: []podstats.PodStats{
				{PodRef: podstats.PodReference{Name: "web-e2e", Namespace: "default", UID: "uid-web-e2e"}, Containers: []podstats.ContainerStats{container("app", u64(5e8))}},
				{PodRef: podstats.PodReference{Name: "new-e2e", Namespace: "kube-system", UID: "uid-new-e2e"}, Containers: []podstats.ContainerStats{container("app", nil)}},
			}},
		Pods: []podstats.PodSample{{Containers: []podstats.ContainerSample{{Window: 10 * time.Second}}}, {Containers: []podstats.ContainerSample{{}}}},
	}
	web, fresh := testPod("default", "web-e2e"), testPod("kube-system", "new-e2e")
	web.Labels = map[string]string{"app": "web"}
	s := New(testCreds)
	s.ServeUsage(fakeUsage{snap})
	s.Ready(&fakeBackend{pods: []v1.Pod{web, fresh}}, nil)
	return s
}

func getJSON(t *testing.T, h http.Handler, path string, v any) int {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	r.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code == http.StatusOK && v != nil {
		if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, w.Body)
		}
	}
	return w.Code
}

// kubectl top looks for metrics.k8s.io in /apis, plain or aggregated.
func TestMetricsDiscovery(t *testing.T) {
	s := newUsageServer(t)
	var groups metav1.APIGroupList
	getJSON(t, s, "/apis", &groups)
	if len(groups.Groups) != 1 || groups.Groups[0].Name != "metrics.k8s.io" || groups.Groups[0].PreferredVersion.Version != "v1beta1" {
		t.Errorf("/apis %+v", groups)
	}
	var res metav1.APIResourceList
	getJSON(t, s, "/apis/metrics.k8s.io/v1beta1", &res)
	if len(res.APIResources) != 2 || res.APIResources[0].Kind != "NodeMetrics" || !res.APIResources[1].Namespaced {
		t.Errorf("resources %+v", res)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/apis", nil)
	r.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
	r.Header.Set("Accept", aggregatedType)
	s.ServeHTTP(w, r)
	if !strings.Contains(w.Body.String(), `"name":"metrics.k8s.io"`) || !strings.Contains(w.Body.String(), `"kind":"PodMetrics"`) {
		t.Errorf("aggregated /apis: %s", w.Body)
	}
	// Without usage, no group and no endpoints.
	bare := newTestServer(nil)
	getJSON(t, bare, "/apis", &groups)
	if len(groups.Groups) != 0 {
		t.Errorf("/apis without usage: %+v", groups)
	}
	if code, _ := do(t, bare, "GET", "/stats/summary", testCreds.ViewToken); code != http.StatusNotFound {
		t.Errorf("/stats/summary without usage: %d", code)
	}
}

// Pods are listed once their containers have a rate; namespace, name and
// label selector filter as the Metrics API does.
func TestPodMetrics(t *testing.T) {
	s := newUsageServer(t)
	var list struct {
		Kind  string
		Items []podMetrics
	}
	getJSON(t, s, "/apis/metrics.k8s.io/v1beta1/pods", &list)
	if list.Kind != "PodMetricsList" || len(list.Items) != 1 || list.Items[0].Name != "web-e2e" {
		t.Fatalf("list %+v", list)
	}
	pm := list.Items[0]
	cpu, mem := pm.Containers[0].Usage[v1.ResourceCPU], pm.Containers[0].Usage[v1.ResourceMemory]
	if cpu.MilliValue() != 500 || mem.Value() != 64<<20 || pm.Window.Duration != 10*time.Second || pm.Labels["app"] != "web" {
		t.Errorf("web-e2e: cpu %s mem %s window %v labels %v", cpu.String(), mem.String(), pm.Window, pm.Labels)
	}
	for path, want := range map[string]int{
		"/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Dweb": 1,
		"/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Ddb":  0,
		"/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods":  0,
		"/apis/metrics.k8s.io/v1beta1/namespaces/default/pods":      1,
	} {
		list = struct {
			Kind  string
			Items []podMetrics
		}{}
		if code := getJSON(t, s, path, &list); code != http.StatusOK || len(list.Items) != want {
			t.Errorf("%s: %d, %d items, want %d", path, code, len(list.Items), want)
		}
	}
	if code := getJSON(t, s, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web-e2e", &pm); code != http.StatusOK || pm.Kind != "PodMetrics" {
		t.Errorf("get web-e2e: %d %+v", code, pm)
	}
	if code, st := do(t, s, "GET", "/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods/new-e2e", testCreds.ViewToken); code != http.StatusNotFound || st.Reason != metav1.StatusReasonNotFound {
		t.Errorf("get new-e2e (no rate yet): %d %+v", code, st)
	}
	if code, _ := do(t, s, "GET", "/apis/metrics.k8s.io/v1beta1/pods?labelSelector=a%3D%3D%3Db", testCreds.ViewToken); code != http.StatusBadRequest {
		t.Errorf("bad selector: %d", code)
	}
}

func TestNodeMetrics(t *testing.T) {
	s := newUsageServer(t)
	var list struct{ Items []nodeMetrics }
	getJSON(t, s, "/apis/metrics.k8s.io/v1beta1/nodes", &list)
	if len(list.Items) != 1 || list.Items[0].Name != "node1" || list.Items[0].Window.Duration != 10*time.Second {
		t.Fatalf("nodes %+v", list)
	}
	if cpu := list.Items[0].Usage[v1.ResourceCPU]; cpu.MilliValue() != 250 {
		t.Errorf("node cpu %s", cpu.String())
	}
	if code, _ := do(t, s, "GET", "/apis/metrics.k8s.io/v1beta1/nodes/other", testCreds.ViewToken); code != http.StatusNotFound {
		t.Errorf("other node: %d", code)
	}
	if code, _ := do(t, s, "GET", "/api/v1/nodes/other/proxy/stats/summary", testCreds.ViewToken); code != http.StatusNotFound {
		t.Errorf("summary through another node's proxy: %d", code)
	}
	var sum podstats.Summary
	if code := getJSON(t, s, "/api/v1/nodes/node1/proxy/stats/summary", &sum); code != http.StatusOK || len(sum.Pods) != 2 {
		t.Errorf("summary: %d %+v", code, sum)
	}
}

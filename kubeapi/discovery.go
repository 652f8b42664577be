package kubeapi

import (
	"mime"
	"net/http"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// aggregatedType is the content type of aggregated discovery (v2), which
// kubectl asks for first and which spares it a request per group version.
const aggregatedType = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

// wantsAggregated reports whether Accept asks for aggregated discovery v2
// before plain JSON.
func wantsAggregated(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || mt != "application/json" {
			continue
		}
		if params["as"] == "APIGroupDiscoveryList" && params["g"] == "apidiscovery.k8s.io" && params["v"] == "v2" {
			return true
		}
		if params["as"] == "" {
			return false
		}
	}
	return false
}

func writeAggregated(w http.ResponseWriter, groups []apidiscoveryv2.APIGroupDiscovery) {
	w.Header().Set("Content-Type", aggregatedType)
	writeJSONTyped(w, &apidiscoveryv2.APIGroupDiscoveryList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"},
		Items:    groups,
	})
}

func (s *Server) serveAPIVersions(w http.ResponseWriter, r *http.Request) {
	if wantsAggregated(r) {
		writeAggregated(w, []apidiscoveryv2.APIGroupDiscovery{{
			Versions: []apidiscoveryv2.APIVersionDiscovery{{
				Version: "v1", Resources: aggregatedResources(), Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent,
			}},
		}})
		return
	}
	writeJSON(w, http.StatusOK, &metav1.APIVersions{
		TypeMeta: metav1.TypeMeta{Kind: "APIVersions"},
		Versions: []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{
			{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host},
		},
	})
}

// serveAPIGroups lists the groups beyond core/v1: the Metrics API, when
// usage is served (kubectl top looks for it here).
func (s *Server) serveAPIGroups(w http.ResponseWriter, r *http.Request) {
	groups, aggregated := s.metricsDiscovery()
	if wantsAggregated(r) {
		writeAggregated(w, aggregated)
		return
	}
	writeJSON(w, http.StatusOK, &metav1.APIGroupList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
		Groups:   groups,
	})
}

func (s *Server) serveResources(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: "v1",
		APIResources: apiResources,
	})
}

var readVerbs = metav1.Verbs{"get", "list", "watch"}

// apiResources are the core/v1 resources served, as the API server lists
// them (kubectl maps names and short names to paths with these). Nodes
// are listed, not watched.
var apiResources = []metav1.APIResource{
	{Name: "events", SingularName: "event", Namespaced: true, Kind: "Event", Verbs: readVerbs, ShortNames: []string{"ev"}},
	{Name: "nodes", SingularName: "node", Namespaced: false, Kind: "Node", Verbs: metav1.Verbs{"get", "list"}, ShortNames: []string{"no"}},
	{Name: "pods", SingularName: "pod", Namespaced: true, Kind: "Pod", Verbs: readVerbs, ShortNames: []string{"po"}, Categories: []string{"all"}},
	{Name: "pods/attach", Namespaced: true, Kind: "PodAttachOptions", Verbs: metav1.Verbs{"create", "get"}},
	{Name: "pods/exec", Namespaced: true, Kind: "PodExecOptions", Verbs: metav1.Verbs{"create", "get"}},
	{Name: "pods/log", Namespaced: true, Kind: "Pod", Verbs: metav1.Verbs{"get"}},
	{Name: "pods/portforward", Namespaced: true, Kind: "PodPortForwardOptions", Verbs: metav1.Verbs{"create", "get"}},
}

// aggregatedResources are apiResources in the aggregated form, with
// subresources under their resource.
func aggregatedResources() []apidiscoveryv2.APIResourceDiscovery {
	var out []apidiscoveryv2.APIResourceDiscovery
	for _, r := range apiResources {
		gvk := &metav1.GroupVersionKind{Version: "v1", Kind: r.Kind}
		if parent, sub, ok := strings.Cut(r.Name, "/"); ok {
			for i := range out {
				if out[i].Resource == parent {
					out[i].Subresources = append(out[i].Subresources, apidiscoveryv2.APISubresourceDiscovery{
						Subresource: sub, ResponseKind: gvk, Verbs: r.Verbs,
					})
				}
			}
			continue
		}
		scope := apidiscoveryv2.ScopeCluster
		if r.Namespaced {
			scope = apidiscoveryv2.ScopeNamespace
		}
		out = append(out, apidiscoveryv2.APIResourceDiscovery{
			Resource: r.Name, ResponseKind: gvk, Scope: scope, SingularResource: r.SingularName,
			Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
		})
	}
	return out
}

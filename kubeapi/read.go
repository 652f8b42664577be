package kubeapi

import (
	"net/http"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// readRoutes adds discovery and the read-only resources; every other
// method on a resource is refused with 405.
func (s *Server) readRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /version", s.serveVersion)
	mux.HandleFunc("GET /api", s.serveAPIVersions)
	mux.HandleFunc("GET /apis", s.serveAPIGroups)
	mux.HandleFunc("GET /api/v1", s.serveResources)
	mux.HandleFunc("GET /api/v1/pods", s.servePods)
	mux.HandleFunc("GET /api/v1/namespaces/{namespace}/pods", s.servePods)
	mux.HandleFunc("GET /api/v1/namespaces/{namespace}/pods/{name}", s.servePod)
	mux.HandleFunc("GET /api/v1/events", s.serveEvents)
	mux.HandleFunc("GET /api/v1/namespaces/{namespace}/events", s.serveEvents)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			writeStatus(w, notFoundMsg("the server could not find the requested resource"))
			return
		}
		writeStatus(w, readOnly(r.Method, resourceOf(r.URL.Path)))
	})
}

// resourceOf names the resource a path is about, for messages.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// api v1 [namespaces NS] RESOURCE [NAME [SUB]]
	if len(parts) >= 5 && parts[2] == "namespaces" {
		parts = parts[4:]
	} else if len(parts) >= 3 {
		parts = parts[2:]
	}
	if len(parts) >= 3 {
		return parts[0] + "/" + parts[2]
	}
	return parts[0]
}

func (s *Server) serveAPIVersions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIVersions{
		TypeMeta: metav1.TypeMeta{Kind: "APIVersions"},
		Versions: []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{
			{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host},
		},
	})
}

func (s *Server) serveAPIGroups(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIGroupList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
		Groups:   []metav1.APIGroup{},
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
// them (kubectl maps names and short names to paths with these).
var apiResources = []metav1.APIResource{
	{Name: "pods", SingularName: "pod", Namespaced: true, Kind: "Pod", Verbs: readVerbs, ShortNames: []string{"po"}, Categories: []string{"all"}},
	{Name: "pods/log", Namespaced: true, Kind: "Pod", Verbs: metav1.Verbs{"get"}},
	{Name: "pods/exec", Namespaced: true, Kind: "PodExecOptions", Verbs: metav1.Verbs{"create", "get"}},
	{Name: "pods/attach", Namespaced: true, Kind: "PodAttachOptions", Verbs: metav1.Verbs{"create", "get"}},
	{Name: "pods/portforward", Namespaced: true, Kind: "PodPortForwardOptions", Verbs: metav1.Verbs{"create", "get"}},
	{Name: "events", SingularName: "event", Namespaced: true, Kind: "Event", Verbs: readVerbs, ShortNames: []string{"ev"}},
}

func (s *Server) servePods(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("namespace")
	list := v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []v1.Pod{}}
	for _, p := range s.be().Pods() {
		if ns == "" || p.Namespace == ns {
			p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
			list.Items = append(list.Items, p)
		}
	}
	writeJSON(w, http.StatusOK, &list)
}

func (s *Server) servePod(w http.ResponseWriter, r *http.Request) {
	p := s.findPod(r.PathValue("namespace"), r.PathValue("name"))
	if p == nil {
		writeStatus(w, notFound("pods", r.PathValue("name")))
		return
	}
	p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("namespace")
	list := v1.EventList{TypeMeta: metav1.TypeMeta{Kind: "EventList", APIVersion: "v1"}, Items: []v1.Event{}}
	for _, ev := range s.be().Events() {
		if ns == "" || ev.Namespace == ns {
			ev.TypeMeta = metav1.TypeMeta{Kind: "Event", APIVersion: "v1"}
			list.Items = append(list.Items, ev)
		}
	}
	writeJSON(w, http.StatusOK, &list)
}

package kubeapi

import (
	"net/http"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
)

// readRoutes adds discovery and the read-only resources; every other
// method on a resource is refused with 405.
func (s *Server) readRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /version", s.serveVersion)
	mux.HandleFunc("GET /api", s.serveAPIVersions)
	mux.HandleFunc("GET /apis", s.serveAPIGroups)
	mux.HandleFunc("GET /api/v1", s.serveResources)
	mux.Handle("GET /api/v1/pods", s.pods.serveList(s))
	mux.Handle("GET /api/v1/namespaces/{namespace}/pods", s.pods.serveList(s))
	mux.Handle("GET /api/v1/namespaces/{namespace}/pods/{name}", s.pods.serveGet(s))
	mux.Handle("GET /api/v1/events", s.events.serveList(s))
	mux.Handle("GET /api/v1/namespaces/{namespace}/events", s.events.serveList(s))
	mux.Handle("GET /api/v1/namespaces/{namespace}/events/{name}", s.events.serveGet(s))
	mux.HandleFunc("GET /api/v1/nodes", s.serveNodes)
	mux.HandleFunc("GET /api/v1/nodes/{name}", s.serveNode)
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

func podResource(s *Server) *resource[v1.Pod] {
	return &resource[v1.Pod]{
		name: "pods", kind: "Pod",
		store: newStore(s.listPods,
			func(p *v1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta },
			func(p *v1.Pod) string { return string(p.UID) }),
		fields: func(p *v1.Pod) fields.Set {
			// The API server's pod fields (pkg/registry/core/pod).
			return fields.Set{
				"metadata.name": p.Name, "metadata.namespace": p.Namespace,
				"spec.nodeName": p.Spec.NodeName, "spec.restartPolicy": string(p.Spec.RestartPolicy),
				"spec.schedulerName": p.Spec.SchedulerName, "spec.serviceAccountName": p.Spec.ServiceAccountName,
				"spec.hostNetwork": boolString(p.Spec.HostNetwork),
				"status.phase":     string(p.Status.Phase), "status.podIP": p.Status.PodIP,
				"status.nominatedNodeName": p.Status.NominatedNodeName,
			}
		},
		columns: podColumns, cells: podCells, conditions: podConditions, now: s.now,
		redact: redactPod,
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// listPods is the backend's pods with a creationTimestamp: static pods have
// none of their own (the API server sets it on the mirror pod), so it is
// when noderun first saw the pod, or its start when that was earlier (a
// pod adopted after a restart).
func (s *Server) listPods() []v1.Pod {
	pods := s.be().Pods()
	seen := make(map[types.UID]time.Time, len(pods))
	now := s.now()
	for i := range pods {
		p := &pods[i]
		t, ok := s.created[p.UID]
		if !ok {
			t = now.Truncate(time.Second)
		}
		if st := p.Status.StartTime; st != nil && st.Time.Before(t) {
			t = st.Time
		}
		seen[p.UID] = t
		if p.CreationTimestamp.IsZero() {
			p.CreationTimestamp = metav1.NewTime(t)
		}
	}
	s.created = seen
	return pods
}

func eventResource(s *Server) *resource[v1.Event] {
	return &resource[v1.Event]{
		name: "events", kind: "Event",
		store: newStore(func() []v1.Event { return s.be().Events() },
			func(e *v1.Event) *metav1.ObjectMeta { return &e.ObjectMeta },
			func(e *v1.Event) string { return e.Namespace + "/" + e.Name }),
		fields: func(e *v1.Event) fields.Set {
			// The API server's event fields (pkg/registry/core/event).
			source := e.Source.Component
			if source == "" {
				source = e.ReportingController
			}
			return fields.Set{
				"metadata.name": e.Name, "metadata.namespace": e.Namespace,
				"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
				"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
				"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
				"involvedObject.fieldPath": e.InvolvedObject.FieldPath,
				"reason":                   e.Reason, "reportingComponent": e.ReportingController,
				"source": source, "type": e.Type,
			}
		},
		columns: eventColumns, cells: eventCells, now: s.now,
	}
}

func (s *Server) serveNodes(w http.ResponseWriter, r *http.Request) {
	table, include, err := negotiateTable(r)
	if err != nil {
		writeStatus(w, status(http.StatusNotAcceptable, metav1.StatusReasonNotAcceptable, err.Error()))
		return
	}
	node := s.be().Node(r.Context())
	items := []v1.Node{*node}
	if sel := r.URL.Query().Get("fieldSelector"); sel != "" {
		fs, err := fields.ParseSelector(sel)
		if err != nil {
			writeStatus(w, badRequest(err.Error()))
			return
		}
		for _, req := range fs.Requirements() {
			if req.Field != "metadata.name" {
				writeStatus(w, badRequest("field label not supported: "+req.Field))
				return
			}
		}
		if !fs.Matches(fields.Set{"metadata.name": node.Name}) {
			items = items[:0]
		}
	}
	if table {
		writeJSON(w, http.StatusOK, nodeTable(items, include, s.now()))
		return
	}
	writeJSON(w, http.StatusOK, &v1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, Items: items})
}

func (s *Server) serveNode(w http.ResponseWriter, r *http.Request) {
	table, include, err := negotiateTable(r)
	if err != nil {
		writeStatus(w, status(http.StatusNotAcceptable, metav1.StatusReasonNotAcceptable, err.Error()))
		return
	}
	node := s.be().Node(r.Context())
	if node.Name != r.PathValue("name") {
		writeStatus(w, notFound("nodes", r.PathValue("name")))
		return
	}
	if table {
		writeJSON(w, http.StatusOK, nodeTable([]v1.Node{*node}, include, s.now()))
		return
	}
	node.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
	writeJSON(w, http.StatusOK, node)
}

func nodeTable(nodes []v1.Node, include metav1.IncludeObjectPolicy, now time.Time) *metav1.Table {
	res := &resource[v1.Node]{
		kind: "Node", columns: nodeColumns, cells: nodeCells, now: func() time.Time { return now },
		store: &store[v1.Node]{meta: func(n *v1.Node) *metav1.ObjectMeta { return &n.ObjectMeta }},
	}
	return res.table(nodes, 0, include)
}

package kubeapi

import (
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeLogRoutes serves the kubelet's node log query at its own path and at
// the node proxy path kubectl get --raw uses, when WithNodeLogs gave one.
func (s *Server) nodeLogRoutes(mux *http.ServeMux) {
	if s.nodeLog == nil {
		return
	}
	for _, prefix := range []string{"", "/api/v1/nodes/{node}/proxy"} {
		mux.HandleFunc("GET "+prefix+"/logs/{path...}", s.serveNodeLogs)
	}
}

// serveNodeLogs hands the request to the node log server, with the path
// the route matched (never one parsed again) under /logs. Only the admin
// token reads the node's logs: they hold what the host logs, not only the
// pods', and a query runs journalctl.
func (s *Server) serveNodeLogs(w http.ResponseWriter, r *http.Request) {
	if roleOf(r) != roleAdmin {
		node := r.PathValue("node")
		if node == "" {
			node = s.be().Node(r.Context()).Name
		}
		// Worded as the API server words it.
		st := forbidden(fmt.Sprintf("nodes %q is forbidden: the view token cannot get resource \"nodes/proxy\"; use the admin token (noderun kubeconfig --admin)", node))
		st.Details = &metav1.StatusDetails{Name: node, Kind: "nodes"}
		writeStatus(w, st)
		return
	}
	if !s.nodeProxied(w, r) {
		return
	}
	release, ok := s.limits.acquire(w, roleOf(r), follows)
	if !ok {
		return
	}
	defer release()
	r = r.Clone(r.Context())
	r.URL.Path, r.URL.RawPath = "/"+r.PathValue("path"), ""
	s.nodeLog.ServeHTTP(w, r)
}

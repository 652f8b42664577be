package kubeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Debugger runs the ephemeral containers of kubectl debug: a Backend that
// implements it serves the pods/ephemeralcontainers subresource.
type Debugger interface {
	// UpdateEphemeralContainers sets the pod's ephemeral containers to
	// list and returns the pod, with warnings for fields noderun ignores.
	// Its errors: ErrNoPod, or an *InvalidError.
	UpdateEphemeralContainers(namespace, name string, list []v1.EphemeralContainer) (*v1.Pod, []error, error)
}

// ErrNoPod and InvalidError are how a Debugger refuses: the pod does not
// run (404), or the update is invalid (422, each error naming its field).
var ErrNoPod = errors.New("no such pod")

type InvalidError interface{ Invalid() []error }

// maxBody bounds a write's body, as the API server's 3 MiB request limit.
const maxBody = 3 << 20

func (s *Server) debugRoutes(mux *http.ServeMux) {
	const sub = "/api/v1/namespaces/{namespace}/pods/{name}/ephemeralcontainers"
	mux.Handle("GET "+sub, s.pods.serveGet(s))
	mux.HandleFunc("PATCH "+sub, s.serveEphemeral)
	mux.HandleFunc("PUT "+sub, s.serveEphemeral)
}

// serveEphemeral updates a pod's ephemeral containers from a PUT of the
// pod or a PATCH of it (JSON, merge or strategic merge patch, as kubectl
// debug sends), as the API server's subresource does: only
// spec.ephemeralContainers is taken from the result.
func (s *Server) serveEphemeral(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if roleOf(r) != roleAdmin {
		st := forbidden(fmt.Sprintf("pods %q is forbidden: the view token cannot %s resource \"pods/ephemeralcontainers\" in the namespace %q; use the admin token (noderun kubeconfig --admin)",
			name, strings.ToLower(r.Method), ns))
		st.Details = &metav1.StatusDetails{Name: name, Kind: "pods"}
		writeStatus(w, st)
		return
	}
	debug, ok := s.be().(Debugger)
	if !ok {
		writeStatus(w, notFoundMsg("this node runs no ephemeral containers"))
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	s.sync()
	cur := s.storedPod(ns, name)
	if cur == nil {
		writeStatus(w, notFound("pods", name))
		return
	}
	want, st := patchedPod(r, cur, body)
	if st != nil {
		writeStatus(w, st)
		return
	}
	if rv := want.ResourceVersion; rv != "" && rv != cur.ResourceVersion {
		writeStatus(w, status(http.StatusConflict, metav1.StatusReasonConflict, fmt.Sprintf(
			"Operation cannot be fulfilled on pods %q: the object has been modified; please apply your changes to the latest version and try again", name)))
		return
	}
	pod, warnings, err := debug.UpdateEphemeralContainers(ns, name, want.Spec.EphemeralContainers)
	for _, w8 := range warnings {
		w.Header().Add("Warning", "299 - "+strconv.Quote(w8.Error()))
	}
	var inv InvalidError
	switch {
	case errors.Is(err, ErrNoPod):
		writeStatus(w, notFound("pods", name))
		return
	case errors.As(err, &inv):
		writeStatus(w, invalid(name, inv.Invalid()))
		return
	case err != nil:
		s.log.Error("ephemeral containers", "pod", ns+"/"+name, "err", err)
		writeStatus(w, internalError(err.Error()))
		return
	}
	pod.ObjectMeta = cur.ObjectMeta
	writeJSON(w, http.StatusOK, s.pods.object(*pod))
}

// readBody reads a write's body, up to maxBody; else it answers 413.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeStatus(w, status(http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, "the request body is over 3 MiB or could not be read: "+err.Error()))
		return nil, false
	}
	return body, true
}

// storedPod is the pod as the API serves it (with its resourceVersion).
func (s *Server) storedPod(namespace, name string) *v1.Pod {
	all, _ := s.pods.store.snapshot()
	for i := range all {
		if all[i].Namespace == namespace && all[i].Name == name {
			return &all[i]
		}
	}
	return nil
}

// patchedPod is cur with the request's body applied: the pod itself for
// a PUT, or a patch of the kind its Content-Type names.
func patchedPod(r *http.Request, cur *v1.Pod, body []byte) (*v1.Pod, *metav1.Status) {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	orig, err := json.Marshal(cur)
	if err != nil {
		return nil, internalError(err.Error())
	}
	var out []byte
	switch {
	case r.Method == http.MethodPut && (mt == "application/json" || mt == ""):
		out = body
	case r.Method == http.MethodPut:
		return nil, unsupportedMedia(mt, "application/json")
	case mt == "application/json-patch+json":
		var p jsonpatch.Patch
		if p, err = jsonpatch.DecodePatch(body); err == nil {
			out, err = p.Apply(orig)
		}
	case mt == "application/merge-patch+json":
		out, err = jsonpatch.MergePatch(orig, body)
	case mt == "application/strategic-merge-patch+json":
		out, err = strategicMergePod(orig, body)
	default:
		return nil, unsupportedMedia(mt, "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json")
	}
	if err != nil {
		return nil, status(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "the patch could not be applied: "+err.Error())
	}
	var p v1.Pod
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, badRequest("the pod could not be decoded: " + err.Error())
	}
	if p.Name != "" && p.Name != cur.Name || p.Namespace != "" && p.Namespace != cur.Namespace {
		return nil, badRequest(fmt.Sprintf("the name of the object (%s/%s) does not match the name on the URL (%s/%s)", p.Namespace, p.Name, cur.Namespace, cur.Name))
	}
	return &p, nil
}

func unsupportedMedia(got, want string) *metav1.Status {
	return status(http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType,
		fmt.Sprintf("the body of the request was in an unknown format %q; accepted: %s", got, want))
}

// invalid is the API server's 422 for an object that fails validation,
// which kubectl prints as `The Pod "x" is invalid: <field>: <message>`.
func invalid(name string, errs []error) *metav1.Status {
	msgs := make([]string, len(errs))
	causes := make([]metav1.StatusCause, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
		causes[i] = metav1.StatusCause{Type: metav1.CauseTypeFieldValueInvalid, Message: err.Error()}
	}
	msg := fmt.Sprintf("Pod %q is invalid: %s", name, strings.Join(msgs, ", "))
	if len(msgs) > 1 {
		msg = fmt.Sprintf("Pod %q is invalid: [%s]", name, strings.Join(msgs, ", "))
	}
	st := status(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, msg)
	st.Details = &metav1.StatusDetails{Name: name, Kind: "Pod", Causes: causes}
	return st
}

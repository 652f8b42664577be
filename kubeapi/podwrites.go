package kubeapi

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/noderun/noderun/manifests"
)

// PodMaker makes and deletes the pods a node accepts through its API: the
// debugger pod of kubectl debug node/<node>. A Backend that implements it
// serves POST and DELETE of pods, for the admin token; other writes stay
// refused.
type PodMaker interface {
	// CreatePod runs pod in namespace; its errors: a *RefusedError,
	// ErrExists or an InvalidError.
	CreatePod(namespace string, pod *v1.Pod) (*v1.Pod, []error, error)
	// DeletePod removes an API-made pod; ErrNoPod for any other.
	DeletePod(namespace, name string) (*v1.Pod, error)
}

// ErrExists: a pod of that name runs (409).
var ErrExists = errors.New("exists")

// RefusedError: not a pod the node makes through its API (405); Message
// says which pods it makes.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return e.Message }

func (s *Server) podWriteRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/namespaces/{namespace}/pods", s.serveCreatePod)
	mux.HandleFunc("DELETE /api/v1/namespaces/{namespace}/pods/{name}", s.serveDeletePod)
}

// podMaker is the backend as a PodMaker when it is one and the request
// has the admin token; else it answers the request and returns nil.
func (s *Server) podMaker(w http.ResponseWriter, r *http.Request, verb string) PodMaker {
	pm, ok := s.be().(PodMaker)
	if !ok {
		writeStatus(w, readOnly(r.Method, "pods"))
		return nil
	}
	if roleOf(r) != roleAdmin {
		writeStatus(w, forbidden(fmt.Sprintf("pods is forbidden: the view token cannot %s resource \"pods\" in the namespace %q; use the admin token (noderun kubeconfig --admin)",
			verb, r.PathValue("namespace"))))
		return nil
	}
	return pm
}

// serveCreatePod creates the pod in the body (decodePod) if the backend
// accepts it, answering 201 with it.
func (s *Server) serveCreatePod(w http.ResponseWriter, r *http.Request) {
	pm := s.podMaker(w, r, "create")
	if pm == nil {
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	in, st := decodePod(r.Header.Get("Content-Type"), body)
	if st != nil {
		writeStatus(w, st)
		return
	}
	name := in.Name
	pod, warnings, err := pm.CreatePod(r.PathValue("namespace"), in)
	for _, w8 := range warnings {
		w.Header().Add("Warning", "299 - "+strconv.Quote(w8.Error()))
	}
	var inv InvalidError
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		st := status(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, refused.Message)
		st.Details = &metav1.StatusDetails{Kind: "pods"}
		writeStatus(w, st)
	case errors.Is(err, ErrExists):
		st := status(http.StatusConflict, metav1.StatusReasonAlreadyExists, fmt.Sprintf("pods %q already exists", name))
		st.Details = &metav1.StatusDetails{Name: name, Kind: "pods"}
		writeStatus(w, st)
	case errors.As(err, &inv):
		writeStatus(w, invalid(name, inv.Invalid()))
	case err != nil:
		s.log.Error("create pod", "pod", name, "err", err)
		writeStatus(w, internalError(err.Error()))
	default:
		writeJSON(w, http.StatusCreated, s.pods.object(*pod))
	}
}

// protobufMagic starts the API's protobuf encoding, a runtime.Unknown
// holding the object's own encoding.
const protobufMagic = "k8s\x00"

// decodePod reads a created pod as kubectl sends it: protobuf (what it
// prefers for built-in types) or JSON, decoded strictly as a manifest.
func decodePod(contentType string, body []byte) (*v1.Pod, *metav1.Status) {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch mt {
	case "application/vnd.kubernetes.protobuf":
		var u runtime.Unknown
		rest, ok := bytes.CutPrefix(body, []byte(protobufMagic))
		if !ok {
			return nil, badRequest("the protobuf body does not start with the API's magic number")
		}
		if err := u.Unmarshal(rest); err != nil {
			return nil, badRequest("the pod could not be decoded: " + err.Error())
		}
		if u.APIVersion != "v1" || u.Kind != "Pod" {
			return nil, badRequest(fmt.Sprintf("the body is a %s %s, not a v1 Pod", u.APIVersion, u.Kind))
		}
		var p v1.Pod
		if err := p.Unmarshal(u.Raw); err != nil {
			return nil, badRequest("the pod could not be decoded: " + err.Error())
		}
		return &p, nil
	case "application/json", "":
		pods, err := manifests.Decode(body)
		if err == nil && len(pods) != 1 {
			err = errors.New("the body is not one Pod")
		}
		if err != nil {
			return nil, badRequest("the pod could not be decoded: " + err.Error())
		}
		return pods[0], nil
	}
	return nil, unsupportedMedia(mt, "application/json, application/vnd.kubernetes.protobuf")
}

// serveDeletePod removes an API-made pod (at once: its grace period is
// its own) and answers with it; static pods stay refused.
func (s *Server) serveDeletePod(w http.ResponseWriter, r *http.Request) {
	pm := s.podMaker(w, r, "delete")
	if pm == nil {
		return
	}
	pod, err := pm.DeletePod(r.PathValue("namespace"), r.PathValue("name"))
	switch {
	case errors.Is(err, ErrNoPod) && s.findPod(r.PathValue("namespace"), r.PathValue("name")) != nil:
		writeStatus(w, readOnly(r.Method, "pods"))
	case errors.Is(err, ErrNoPod):
		writeStatus(w, notFound("pods", r.PathValue("name")))
	case err != nil:
		writeStatus(w, internalError(err.Error()))
	default:
		writeJSON(w, http.StatusOK, s.pods.object(*pod))
	}
}

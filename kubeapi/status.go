package kubeapi

import (
	"encoding/json"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Errors are answered as the API server answers them: a metav1.Status
// with the HTTP code, a reason kubectl understands and a message it shows.
func status(code int, reason metav1.StatusReason, msg string) *metav1.Status {
	return &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     int32(code),
	}
}

func unauthorized() *metav1.Status {
	return status(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
}

func forbidden(msg string) *metav1.Status {
	return status(http.StatusForbidden, metav1.StatusReasonForbidden, msg)
}

func unavailable(msg string) *metav1.Status {
	return status(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, msg)
}

func notFoundMsg(msg string) *metav1.Status {
	return status(http.StatusNotFound, metav1.StatusReasonNotFound, msg)
}

// notFound is the API server's answer for a missing object, which kubectl
// prints as `Error from server (NotFound): pods "x" not found`.
func notFound(resource, name string) *metav1.Status {
	st := notFoundMsg(resource + " \"" + name + "\" not found")
	st.Details = &metav1.StatusDetails{Name: name, Kind: resource}
	return st
}

func internalError(msg string) *metav1.Status {
	return status(http.StatusInternalServerError, metav1.StatusReasonInternalError, msg)
}

func badRequest(msg string) *metav1.Status {
	return status(http.StatusBadRequest, metav1.StatusReasonBadRequest, msg)
}

// readOnly answers writes: static pods change through their manifests.
func readOnly(method, resource string) *metav1.Status {
	st := status(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
		method+" is not allowed on "+resource+": noderun runs static pods, which change through their manifests (see `noderun manifests`)")
	st.Details = &metav1.StatusDetails{Kind: resource}
	return st
}

func writeStatus(w http.ResponseWriter, st *metav1.Status) {
	writeJSON(w, int(st.Code), st)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONTyped answers 200 with v, the Content-Type already set.
func writeJSONTyped(w http.ResponseWriter, v any) {
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

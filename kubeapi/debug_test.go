package kubeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeDebugger is a backend that takes ephemeral containers: it records
// what it was given and refuses a container named "bad".
type fakeDebugger struct {
	fakeBackend
	got []v1.EphemeralContainer
}

type fakeInvalid []error

func (f fakeInvalid) Error() string    { return "invalid" }
func (f fakeInvalid) Invalid() []error { return f }

func (f *fakeDebugger) UpdateEphemeralContainers(ns, name string, list []v1.EphemeralContainer) (*v1.Pod, []error, error) {
	if name != "web-e2e" {
		return nil, nil, ErrNoPod
	}
	for _, c := range list {
		if c.Name == "bad" {
			return nil, nil, fakeInvalid{errors.New("spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container")}
		}
	}
	f.got = list
	p := testPod(ns, name)
	p.Spec.EphemeralContainers = list
	return &p, []error{errors.New("a warning")}, nil
}

func TestEphemeralContainersSubresource(t *testing.T) {
	view, admin := testCreds.ViewToken, testCreds.AdminToken
	const sub = "/api/v1/namespaces/default/pods/web-e2e/ephemeralcontainers"
	withDbg := `{"spec":{"ephemeralContainers":[{"name":"dbg","image":"busybox"}]}}`
	tests := []struct {
		name, method, path, token, ctype, body string
		want                                   int
		wantNames                              string
	}{
		{"view reads", "GET", sub, view, "", "", 200, ""},
		{"view may not patch", "PATCH", sub, view, "application/strategic-merge-patch+json", withDbg, 403, ""},
		{"strategic merge patch, as kubectl debug", "PATCH", sub, admin, "application/strategic-merge-patch+json",
			`{"spec":{"$setElementOrder/ephemeralContainers":[{"name":"dbg"}],"ephemeralContainers":[{"name":"dbg","image":"busybox"}]}}`, 200, "dbg"},
		{"merge patch", "PATCH", sub, admin, "application/merge-patch+json", withDbg, 200, "dbg"},
		{"JSON patch", "PATCH", sub, admin, "application/json-patch+json",
			`[{"op":"add","path":"/spec/ephemeralContainers","value":[{"name":"j","image":"busybox"}]}]`, 200, "j"},
		{"PUT of the pod", "PUT", sub, admin, "application/json", `{"metadata":{"name":"web-e2e"},` + withDbg[1:], 200, "dbg"},
		{"PUT of a stale version", "PUT", sub, admin, "application/json", `{"metadata":{"name":"web-e2e","resourceVersion":"999"},` + withDbg[1:], 409, ""},
		{"PUT of another pod", "PUT", sub, admin, "application/json", `{"metadata":{"name":"other"},` + withDbg[1:], 400, ""},
		{"apply patch", "PATCH", sub, admin, "application/apply-patch+yaml", "{}", 415, ""},
		{"a patch that does not apply", "PATCH", sub, admin, "application/json-patch+json", `[{"op":"replace","path":"/nope/x","value":1}]`, 422, ""},
		{"invalid", "PATCH", sub, admin, "application/merge-patch+json", `{"spec":{"ephemeralContainers":[{"name":"bad","image":"b"}]}}`, 422, ""},
		{"no such pod", "PATCH", "/api/v1/namespaces/default/pods/nope/ephemeralcontainers", admin, "application/merge-patch+json", withDbg, 404, ""},
		{"too large", "PATCH", sub, admin, "application/merge-patch+json", `{"x":"` + strings.Repeat("x", maxBody) + `"}`, 413, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := &fakeDebugger{fakeBackend: fakeBackend{pods: []v1.Pod{testPod("default", "web-e2e")}}}
			w := write(be, tt.method, tt.path, tt.token, tt.ctype, []byte(tt.body))
			if w.Code != tt.want {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tt.want)
			}
			if w.Code != 200 {
				var st metav1.Status
				if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || int(st.Code) != w.Code {
					t.Errorf("answer %s: want a Status of %d", w.Body, w.Code)
				}
				if w.Code == 422 && tt.name == "invalid" && st.Message != `Pod "web-e2e" is invalid: spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container` {
					t.Errorf("message %q", st.Message)
				}
				return
			}
			var p v1.Pod
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Kind != "Pod" || p.Name != "web-e2e" {
				t.Fatalf("answer %s: want the pod", w.Body)
			}
			if tt.wantNames == "" {
				return
			}
			if len(be.got) != 1 || be.got[0].Name != tt.wantNames {
				t.Errorf("the backend got %+v, want %s", be.got, tt.wantNames)
			}
			if got := w.Header().Get("Warning"); got != `299 - "a warning"` {
				t.Errorf("Warning header %q", got)
			}
		})
	}
}

// write sends a write with a body to a server on be and returns its answer.
func write(be Backend, method, path, token, ctype string, body []byte) *httptest.ResponseRecorder {
	s := New(testCreds)
	s.Ready(be, nil)
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+token)
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// Without a Debugger backend the subresource is missing, which kubectl
// debug reports as ephemeral containers being disabled.
func TestEphemeralContainersWithoutDebugger(t *testing.T) {
	code, st := do(t, newTestServer(nil), http.MethodPatch, "/api/v1/namespaces/default/pods/web-e2e/ephemeralcontainers", testCreds.AdminToken)
	if code != 404 || st.Details != nil {
		t.Errorf("%d %+v, want 404 without details", code, st)
	}
}

func TestStrategicMergePod(t *testing.T) {
	orig := `{"metadata":{"name":"p","labels":{"a":"1"}},"spec":{"containers":[{"name":"app"}],` +
		`"ephemeralContainers":[{"name":"one","image":"x"},{"name":"two","image":"y"}]}}`
	tests := []struct{ name, patch, want, wantErr string }{
		{"kubectl debug's", `{"spec":{"$setElementOrder/ephemeralContainers":[{"name":"one"},{"name":"two"},{"name":"three"}],"ephemeralContainers":[{"name":"three","image":"z"}]}}`,
			`[{"image":"x","name":"one"},{"image":"y","name":"two"},{"image":"z","name":"three"}]`, ""},
		{"merge into one by name", `{"spec":{"ephemeralContainers":[{"name":"two","tty":true}]}}`,
			`[{"image":"x","name":"one"},{"image":"y","name":"two","tty":true}]`, ""},
		{"reorder", `{"spec":{"$setElementOrder/ephemeralContainers":[{"name":"two"},{"name":"one"}]}}`,
			`[{"image":"y","name":"two"},{"image":"x","name":"one"}]`, ""},
		{"delete one", `{"spec":{"ephemeralContainers":[{"name":"one","$patch":"delete"}]}}`,
			`[{"image":"y","name":"two"}]`, ""},
		{"null deletes", `{"spec":{"ephemeralContainers":null}}`, `null`, ""},
		{"other directive", `{"spec":{"$retainKeys":["containers"]}}`, "", "$retainKeys is not supported"},
		{"no name", `{"spec":{"ephemeralContainers":[{"image":"z"}]}}`, "", "needs a name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := strategicMergePod([]byte(orig), []byte(tt.patch))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("%v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Spec struct {
					Containers          json.RawMessage
					EphemeralContainers json.RawMessage
				}
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if string(got.Spec.EphemeralContainers) != tt.want && !(tt.want == "null" && got.Spec.EphemeralContainers == nil) {
				t.Errorf("ephemeralContainers %s, want %s", got.Spec.EphemeralContainers, tt.want)
			}
			if string(got.Spec.Containers) != `[{"name":"app"}]` {
				t.Errorf("containers changed: %s", got.Spec.Containers)
			}
		})
	}
}

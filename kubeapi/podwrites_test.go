package kubeapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// fakeMaker accepts pods named "dbg" and deletes only those it made.
type fakeMaker struct {
	fakeBackend
	made []*v1.Pod
}

func (f *fakeMaker) CreatePod(ns string, pod *v1.Pod) (*v1.Pod, []error, error) {
	switch pod.Name {
	case "dbg":
		pod.Namespace = ns
		f.made = append(f.made, pod)
		return pod, nil, nil
	case "taken":
		return nil, nil, ErrExists
	case "bad":
		return nil, nil, fakeInvalid{errors.New("spec.containers[0].image: required")}
	}
	return nil, nil, &RefusedError{Message: "only kubectl debug node/n1"}
}

func (f *fakeMaker) DeletePod(ns, name string) (*v1.Pod, error) {
	if name == "dbg" {
		p := testPod(ns, name)
		return &p, nil
	}
	return nil, ErrNoPod
}

// protobufPod is pod as kubectl sends it by default: the API's protobuf.
func protobufPod(t *testing.T, pod *v1.Pod) []byte {
	raw, err := pod.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: "Pod"}, Raw: raw, ContentType: "application/vnd.kubernetes.protobuf"}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(protobufMagic), b...)
}

func TestPodWrites(t *testing.T) {
	view, admin := testCreds.ViewToken, testCreds.AdminToken
	const pods = "/api/v1/namespaces/default/pods"
	named := func(name string) *v1.Pod {
		return &v1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
	}
	asJSON := func(p *v1.Pod) []byte { b, _ := json.Marshal(p); return b }
	const pbType = "application/vnd.kubernetes.protobuf"
	tests := []struct {
		name, method, path, token, ctype string
		body                             []byte
		want                             int
		wantMsg                          string
	}{
		{"protobuf, as kubectl debug node", "POST", pods, admin, pbType, protobufPod(t, named("dbg")), 201, ""},
		{"JSON", "POST", pods, admin, "application/json", asJSON(named("dbg")), 201, ""},
		{"JSON with an unknown field", "POST", pods, admin, "application/json", []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"dbg"},"spec":{"nope":1}}`), 400, "nope"},
		{"protobuf of another kind", "POST", pods, admin, pbType, append([]byte(protobufMagic), mustUnknown(t, "Service")...), 400, "not a v1 Pod"},
		{"protobuf without its magic", "POST", pods, admin, pbType, []byte("xx"), 400, "magic"},
		{"YAML", "POST", pods, admin, "application/yaml", []byte("x: 1"), 415, ""},
		{"view token", "POST", pods, view, "application/json", asJSON(named("dbg")), 403, "view token cannot create"},
		{"another pod", "POST", pods, admin, "application/json", asJSON(named("web")), 405, "only kubectl debug node/n1"},
		{"taken name", "POST", pods, admin, "application/json", asJSON(named("taken")), 409, `already exists`},
		{"invalid", "POST", pods, admin, "application/json", asJSON(named("bad")), 422, `is invalid: spec.containers[0].image: required`},
		{"delete the debugger", "DELETE", pods + "/dbg", admin, "", nil, 200, ""},
		{"delete a static pod", "DELETE", pods + "/web-e2e", admin, "", nil, 405, "manifests"},
		{"delete a missing pod", "DELETE", pods + "/nope", admin, "", nil, 404, ""},
		{"delete with the view token", "DELETE", pods + "/dbg", view, "", nil, 403, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := &fakeMaker{fakeBackend: fakeBackend{pods: []v1.Pod{testPod("default", "web-e2e")}}}
			w := write(be, tt.method, tt.path, tt.token, tt.ctype, tt.body)
			if w.Code != tt.want || !strings.Contains(w.Body.String(), tt.wantMsg) {
				t.Fatalf("%d %s, want %d with %q", w.Code, w.Body, tt.want, tt.wantMsg)
			}
			if w.Code == 201 && (len(be.made) != 1 || be.made[0].Namespace != "default" || be.made[0].Spec.Containers[0].Image != "busybox") {
				t.Errorf("the backend made %+v", be.made)
			}
		})
	}
	// A backend that makes no pods refuses every write as before.
	code, st := do(t, newTestServer(nil), http.MethodPost, pods, admin)
	if code != 405 || !strings.Contains(st.Message, "manifests") {
		t.Errorf("POST without a PodMaker: %d %s", code, st.Message)
	}
}

func mustUnknown(t *testing.T, kind string) []byte {
	b, err := (&runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

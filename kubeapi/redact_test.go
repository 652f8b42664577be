package kubeapi

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// secretPod carries "hunter2" everywhere a static manifest puts a secret.
func secretPod() v1.Pod {
	p := phasePod("web", v1.PodRunning)
	p.Annotations = map[string]string{v1.LastAppliedConfigAnnotation: `{"env":"hunter2"}`, "team": "a"}
	header := []v1.HTTPHeader{{Name: "Authorization", Value: "Bearer hunter2"}}
	always := v1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = []v1.Container{{Name: "side", RestartPolicy: &always, Env: []v1.EnvVar{{Name: "TOKEN", Value: "hunter2"}}}}
	p.Spec.Containers = []v1.Container{{
		Name: "app", Command: []string{"serve", "--port=80"},
		Env: []v1.EnvVar{
			{Name: "DB_PASSWORD", Value: "hunter2"},
			{Name: "EMPTY"},
			{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		},
		LivenessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Port: intstr.FromInt(80), HTTPHeaders: header}}},
		Lifecycle:     &v1.Lifecycle{PreStop: &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Port: intstr.FromInt(80), HTTPHeaders: header}}},
	}}
	return p
}

// The view token reads pods with their secrets redacted, through every
// way of reading them; the admin token reads them as they are.
func TestViewTokenReadsPodsRedacted(t *testing.T) {
	s := New(testCreds)
	s.Ready(&fakeBackend{pods: []v1.Pod{secretPod()}}, nil)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	read := func(token, path, accept string) string {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", accept)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		if strings.Contains(path, "watch") { // its first event only
			line, _ := bufio.NewReader(resp.Body).ReadString('\n')
			return line
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, path := range []string{
		"/api/v1/pods",
		"/api/v1/namespaces/default/pods",
		"/api/v1/namespaces/default/pods/web",
		"/api/v1/pods?watch=true",
		"/api/v1/pods?includeObject=Object",
		"/api/v1/namespaces/default/pods/web?includeObject=Object",
		"/api/v1/pods?watch=true&includeObject=Object",
	} {
		accept := "application/json"
		if strings.Contains(path, "includeObject") {
			accept = tableAccept
		}
		view := read(testCreds.ViewToken, path, accept)
		if strings.Contains(view, "hunter2") || strings.Count(view, redacted) != 5 {
			t.Errorf("view token, %s: %d redacted values, secret shown %t:\n%s", path, strings.Count(view, redacted), strings.Contains(view, "hunter2"), view)
		}
		for _, kept := range []string{`"team":"a"`, "spec.nodeName", "--port=80", `"name":"EMPTY"`} {
			if !strings.Contains(view, kept) {
				t.Errorf("view token, %s: %s is gone", path, kept)
			}
		}
		if admin := read(testCreds.AdminToken, path, accept); strings.Count(admin, "hunter2") != 5 {
			t.Errorf("admin token, %s: %d secrets shown, want 5:\n%s", path, strings.Count(admin, "hunter2"), admin)
		}
	}
}

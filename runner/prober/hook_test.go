package prober

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestExecHook(t *testing.T) {
	errGone := errors.New("container gone")
	app := &v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "F", Value: "/x"}}}
	for _, tc := range []struct {
		name    string
		fake    fakeExec
		wantErr string
		wrapped error
	}{
		{"exit 0", fakeExec{out: "done"}, "", nil},
		{"exit 3", fakeExec{out: "oops", code: 3},
			`Exec lifecycle hook ([sh -c echo $(F)]) for Container "app" failed - error: command 'sh -c echo $(F)' exited with 3: oops, message: "oops"`, nil},
		{"runtime error", fakeExec{err: errGone},
			`Exec lifecycle hook ([sh -c echo $(F)]) for Container "app" failed - error: container gone, message: ""`, errGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake
			h := &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sh", "-c", "echo $(F)"}}}
			err := DoHook(context.Background(), h, Target{ContainerID: "c1", Container: app}, f.exec)
			if errString(err) != tc.wantErr || (tc.wrapped != nil && !errors.Is(err, tc.wrapped)) {
				t.Errorf("got %v, want %q", err, tc.wantErr)
			}
			// A hook's command runs as written, on the context's time only.
			if f.cmd[2] != "echo $(F)" || f.id != "c1" || f.timeout != 0 {
				t.Errorf("ran %q in %q with timeout %s", f.cmd, f.id, f.timeout)
			}
		})
	}
}

func TestHTTPHook(t *testing.T) {
	s := newProbeServer(t, "127.0.0.1:0", false)
	closed := closedPort(t)
	tgt := Target{PodIP: "127.0.0.1", Container: &v1.Container{Name: "app"}}
	hook := func(scheme v1.URIScheme, port int, path string) *v1.LifecycleHandler {
		return &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Scheme: scheme, Port: intstr.FromInt(port), Path: path,
			HTTPHeaders: []v1.HTTPHeader{{Name: "Authorization", Value: "Bearer x"}}}}
	}
	// The kubelet does not look at the status code.
	if err := DoHook(context.Background(), hook("", s.port, "/status/500"), tgt, nil); err != nil {
		t.Errorf("hook answered 500: %v", err)
	}
	if r := s.saw("/status/500"); r.hits != 1 || r.header.Get("User-Agent") != "kube-lifecycle/1.37" {
		t.Errorf("%d requests, user agent %q", r.hits, r.header.Get("User-Agent"))
	}
	want := fmt.Sprintf(`HTTP lifecycle hook (/quit) for Container "app" failed - error: Get "http://127.0.0.1:%d/quit": dial tcp 127.0.0.1:%d: connect: connection refused`, closed, closed)
	if err := DoHook(context.Background(), hook("", closed, "/quit"), tgt, nil); errString(err) != want {
		t.Errorf("hook to a closed port: %v, want %q", err, want)
	}
	// An https hook answered in plain HTTP is made again in plain HTTP,
	// without its credentials.
	if err := DoHook(context.Background(), hook(v1.URISchemeHTTPS, s.port, "/plain"), tgt, nil); err != nil {
		t.Errorf("https hook to a plain server: %v", err)
	}
	if r := s.saw("/plain"); r.hits != 1 || r.header.Get("Authorization") != "" {
		t.Errorf("plain retry: %d requests, Authorization %q", r.hits, r.header.Get("Authorization"))
	}
}

func TestSleepHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tgt := Target{Container: &v1.Container{Name: "app"}}
		start := time.Now()
		if err := DoHook(context.Background(), &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 5}}, tgt, nil); err != nil || time.Since(start) != 5*time.Second {
			t.Errorf("sleep 5: %v after %s", err, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start = time.Now()
		err := DoHook(ctx, &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 30}}, tgt, nil)
		want := `Sleep lifecycle hook (30) for Container "app" failed - error: container terminated before sleep hook finished`
		if errString(err) != want || time.Since(start) != 2*time.Second {
			t.Errorf("sleep 30 cut at 2 s: %v after %s", err, time.Since(start))
		}
	})
}

func TestHookWithoutHandler(t *testing.T) {
	if err := DoHook(context.Background(), &v1.LifecycleHandler{}, Target{}, nil); err == nil {
		t.Error("a hook without a handler ran")
	}
}

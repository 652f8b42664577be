package e2e

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/kubeapi"
)

// manifestServer serves one manifest over HTTP on a fixed loopback address,
// and can go down and come back on the same address.
type manifestServer struct {
	t    *testing.T
	addr string
	mu   sync.Mutex
	body string
	srv  *http.Server
}

func newManifestServer(t *testing.T, body string) *manifestServer {
	s := &manifestServer{t: t, body: body}
	s.up("127.0.0.1:0")
	t.Cleanup(s.down)
	return s
}

func (s *manifestServer) url() string { return "http://" + s.addr + "/pods.yaml" }

func (s *manifestServer) set(body string) { s.mu.Lock(); s.body = body; s.mu.Unlock() }

func (s *manifestServer) up(addr string) {
	s.t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.addr = l.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			s.t.Errorf("manifest server: %v", err)
		}
	}()
}

func (s *manifestServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body := s.body
	s.mu.Unlock()
	etag := fmt.Sprintf(`"%x"`, sha256.Sum256([]byte(body)))
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Write([]byte(body))
}

func (s *manifestServer) down() { _ = s.srv.Close() }

// urlSource returns the status API's view of the URL source.
func (n *node) urlSource() manifestsInfo {
	n.t.Helper()
	var list kubeapi.ManifestSources
	if err := n.get("/manifests", &list); err != nil {
		n.t.Fatal(err)
	}
	for _, s := range list.Sources {
		if s.Kind == "url" {
			return manifestsInfo{errors: s.Errors, pods: len(s.Pods)}
		}
	}
	n.t.Fatalf("no URL source in /manifests: %+v", list)
	return manifestsInfo{}
}

type manifestsInfo struct {
	errors []string
	pods   int
}

// A pod from a manifest URL keeps running, the same container and process,
// while the server is down, across a noderun restart without the server,
// and is replaced once the server serves a new version; an empty PodList
// removes it.
func TestManifestURL(t *testing.T) {
	t.Parallel()
	srv := newManifestServer(t, sleeperPod("urlpod", "busybox:1.36", "version-one"))
	n := newNode(t, "--manifest-url", srv.url(), "--url-check-interval", "200ms", "--url-timeout", "1s")
	old := n.waitPod("urlpod", "Running", running)
	n.waitLogLine(n.logPath(old, "main", 0), "version-one")
	if old.Annotations["kubernetes.io/config.source"] != "http" {
		t.Errorf("config.source = %q, want http", old.Annotations["kubernetes.io/config.source"])
	}
	id := containerID(old.Status.ContainerStatuses[0])
	pid := n.task(id).Pid
	unchanged := func(when string) {
		t.Helper()
		p := n.pod("urlpod")
		if p == nil || p.UID != old.UID || !running(p) || containerID(p.Status.ContainerStatuses[0]) != id {
			t.Fatalf("%s: pod changed: %v", when, p)
		}
		if st := n.task(id); st.Status != tasktypes.Status_RUNNING || st.Pid != pid {
			t.Fatalf("%s: task %v pid %d, want RUNNING pid %d", when, st.Status, st.Pid, pid)
		}
	}

	srv.down()
	waitUntil(t, "the outage shows in /manifests", func() bool { return len(n.urlSource().errors) > 0 })
	unchanged("server down")

	n.stop()
	n.start()
	if info := n.urlSource(); info.pods != 1 {
		t.Fatalf("restarted without the server: %d pods from the kept response, want 1", info.pods)
	}
	n.waitPod("urlpod", "adopted", running)
	unchanged("restarted without the server")

	srv.set(sleeperPod("urlpod", "busybox:1.36", "version-two"))
	srv.up(srv.addr)
	p := n.waitPod("urlpod", "replaced and Running", func(p *v1.Pod) bool { return p.UID != old.UID && running(p) })
	n.waitLogLine(n.logPath(p, "main", 0), "version-two")
	if cs := n.containers(string(old.UID)); len(cs) != 0 {
		t.Errorf("old pod still has %d containers", len(cs))
	}
	if files, _ := filepath.Glob(filepath.Join(n.state, "sources", "*.json")); len(files) != 1 {
		t.Errorf("kept responses: %v, want one", files)
	}
	if errs := n.urlSource().errors; len(errs) != 0 {
		t.Errorf("errors after recovery: %v", errs)
	}

	// Only an explicit empty list removes the pod.
	srv.set("apiVersion: v1\nkind: PodList\nitems: []\n")
	n.waitGone("urlpod", waitTimeout)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitUntilFor(t, what, waitTimeout, cond)
}

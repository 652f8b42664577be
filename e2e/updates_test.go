package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/runner"
)

// slowProxy serves a registry through a loopback proxy that, while held,
// keeps every blob download waiting until release: a registry that serves
// as slowly as the test needs, with no sleep to tune. While failing, blob
// downloads fail (503).
type slowProxy struct {
	addr    string
	mu      sync.Mutex
	gate    chan struct{} // nil: blobs flow
	held    atomic.Int32  // blob requests that waited
	failing atomic.Bool
}

// slowProxy starts a proxy to r; the node pulls through it over plain
// HTTP (its hosts.toml says so).
func (r *registry) slowProxy(t *testing.T, n *node) *slowProxy {
	t.Helper()
	target, err := url.Parse("http://" + r.addr)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &slowProxy{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, "/blobs/") && p.failing.Load() {
			http.Error(w, "registry unavailable", http.StatusServiceUnavailable)
			return
		}
		if strings.Contains(req.URL.Path, "/blobs/") {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			if gate != nil {
				p.held.Add(1)
				select {
				case <-gate:
				case <-req.Context().Done():
					return
				}
			}
		}
		rp.ServeHTTP(w, req)
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		p.release()
		srv.Close()
	})
	n.writeHostsToml(p.addr, fmt.Sprintf("server = \"http://%[1]s\"\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", p.addr))
	return p
}

// hold makes blob downloads wait from now on; release lets them go.
func (p *slowProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held.Store(0)
	p.gate = make(chan struct{})
}

func (p *slowProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// pushWeb pushes a busybox image as name whose command serves page on
// port 8080, or, with page "", exits 1 at once (a broken version).
func pushWeb(t *testing.T, name, page string) {
	t.Helper()
	img, err := ociimage.Busybox(name)
	if err != nil {
		t.Fatal(err)
	}
	img.Cmd = []string{"sh", "-c", "echo broken; exit 1"}
	if page != "" {
		img.Files["/var/www/index.html"] = ociimage.Regular([]byte(page+"\n"), 0o644)
		img.Cmd = []string{"httpd", "-f", "-p", "8080", "-h", "/var/www"}
	}
	pushImage(t, img, "", "", "")
}

// updatePod is pod "web" running image, Ready when it serves; with after
// set it opts into rollback.
func updatePod(image, after string) string {
	meta := "metadata: {name: web}"
	if after != "" {
		meta = fmt.Sprintf("metadata:\n  name: web\n  annotations: {noderun.dev/rollback-after: %q}", after)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
%s
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
`, meta, image)
}

func ready(p *v1.Pod) bool { return running(p) && podConditionTrue(p, v1.PodReady) }

// eventRV is the resourceVersion (noderun's order of recording) of the
// first event of pod uid with reason, 0 if none.
func eventRV(evs []v1.Event, uid, reason string) int {
	for _, ev := range evs {
		if string(ev.InvolvedObject.UID) == uid && ev.Reason == reason {
			rv, _ := strconv.Atoi(ev.ResourceVersion)
			return rv
		}
	}
	return 0
}

// waitEvent waits for an event of pod "web" with reason whose message
// contains substr.
func (n *node) waitEvent(reason, substr string) {
	n.t.Helper()
	waitUntil(n.t, "a "+reason+" event with "+substr, func() bool {
		return slices.ContainsFunc(n.events("web"), func(ev v1.Event) bool {
			return ev.Reason == reason && strings.Contains(ev.Message, substr)
		})
	})
}

// startUpdate starts a node and a registry holding app:1, serving "one",
// and app:second (serving page, or broken when page is ""), pulled through
// a slowProxy, and runs pod "web" on app:1 (opting into rollback when
// after is set) until it is Ready.
func startUpdate(t *testing.T, second, page, after string) (*node, *registry, *slowProxy, *v1.Pod) {
	t.Helper()
	n := newNode(t)
	reg := startRegistry(t)
	pushWeb(t, reg.addr+"/app:1", "one")
	pushWeb(t, reg.addr+"/app:"+second, page)
	slow := reg.slowProxy(t, n)
	n.writeManifest("web.yaml", updatePod(slow.addr+"/app:1", after))
	p := n.waitPodFor("web", "Ready", 60*time.Second, ready)
	if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != "one\n" {
		t.Fatalf("v1 serves %q", got)
	}
	return n, reg, slow, p
}

// TestUpdateDownloadThenReplace: an image bump whose pull fails keeps the
// old version, with a warning, and is retried after the kubelet's 10 s;
// over a registry that serves slowly it pulls while the old version keeps
// serving on its pod IP; the old
// version stops only after the pull (noderun's event order says so), and
// the new one serves. A noderun crash in the middle of the pull ends with
// the old version adopted and still serving, the pull started over.
func TestUpdateDownloadThenReplace(t *testing.T) {
	t.Parallel()
	n, _, slow, old := startUpdate(t, "2", "two", "")
	oldID := containerID(old.Status.ContainerStatuses[0])

	// A pull that fails keeps the old version, says why, and is retried.
	slow.failing.Store(true)
	n.writeManifest("web.yaml", updatePod(slow.addr+"/app:2", ""))
	n.waitEvent("UpdatePullFailed", `Failed to pull image "`+slow.addr+`/app:2" for the pod's new version`)
	n.waitEvent("UpdatePullFailed", "this version keeps running, next try in 10s")
	if p := n.pod("web"); p == nil || p.UID != old.UID || !running(p) {
		t.Fatalf("after a failed pull: %s", statusJSON(p))
	}
	slow.hold()
	slow.failing.Store(false)
	servesOld := func(when string) {
		t.Helper()
		waitUntil(t, "a blob download is held", func() bool { return slow.held.Load() > 0 })
		// Listed alone, as the old version (after a restart, Ready again
		// once its probe passes: probe results start over).
		p := n.waitPod("web", when, func(p *v1.Pod) bool { return p.UID == old.UID && ready(p) })
		if id := containerID(p.Status.ContainerStatuses[0]); id != oldID || len(n.pods()) != 1 {
			t.Fatalf("%s: container %s, want %s, running alone: %d pods", when, id, oldID, len(n.pods()))
		}
		if got := httpGet(t, "http://"+old.Status.PodIP+":8080/"); got != "one\n" {
			t.Fatalf("%s: the old version serves %q", when, got)
		}
	}
	servesOld("during the pull, retried after the backoff")
	n.waitEvent("UpdatePulling", `Pulling image "`+slow.addr+`/app:2" for the pod's new version`)

	// A crash mid-pull: the old version is adopted and keeps serving.
	n.kill9()
	slow.hold() // counts the new noderun's requests
	n.start()
	servesOld("during the pull after a noderun restart")

	slow.release()
	p := n.waitPodFor("web", "replaced and Ready", 60*time.Second, func(p *v1.Pod) bool { return p.UID != old.UID && ready(p) })
	if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != "two\n" {
		t.Errorf("v2 serves %q", got)
	}
	evs := n.events("web")
	pulled, killed := eventRV(evs, string(old.UID), "UpdatePulled"), eventRV(evs, string(old.UID), "Killing")
	if pulled == 0 || killed == 0 || killed < pulled {
		t.Errorf("the old version's events: UpdatePulled at %d, Killing at %d; want the pull first: %+v", pulled, killed, evs)
	}
}

// TestUpdateRollsBack: a new version whose image exits at once is not
// Ready within noderun.dev/rollback-after, and the last Ready version runs
// and serves again, with a RolledBack event and condition; the manifest is
// untouched. A noderun crash before the deadline does not move it (it
// counts from the failed version's start), and one after the rollback
// keeps it: the failed version is not run again.
func TestUpdateRollsBack(t *testing.T) {
	t.Parallel()
	n, reg, slow, good := startUpdate(t, "broken", "", "20s")
	bad := updatePod(slow.addr+"/app:broken", "20s")
	n.writeManifest("web.yaml", bad)
	failing := n.waitPodFor("web", "the broken version crashing", 60*time.Second, func(p *v1.Pod) bool {
		return p.UID != good.UID && p.Status.ContainerStatuses[0].RestartCount > 0
	})

	// A crash before the deadline.
	n.kill9()
	n.start()
	p := n.waitPodFor("web", "rolled back", 60*time.Second, func(p *v1.Pod) bool {
		return p.UID == good.UID && ready(p) && podConditionTrue(p, runner.ConditionRolledBack)
	})
	if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != "one\n" {
		t.Errorf("the version rolled back to serves %q", got)
	}
	var cond v1.PodCondition
	for _, c := range p.Status.Conditions {
		if c.Type == runner.ConditionRolledBack {
			cond = c
		}
	}
	if cond.Reason != "CrashLoopBackOff" || !strings.Contains(cond.Message, "Version "+string(failing.UID)+" was not Ready within 20s of its start") {
		t.Errorf("RolledBack condition %+v", cond)
	}
	// The deadline counted from the failed version's start, across the
	// crash: noderun's own records.
	if took := cond.LastTransitionTime.Sub(failing.Status.StartTime.Time); took < 20*time.Second || took > 50*time.Second {
		t.Errorf("rolled back %s after the failed version's start, want 20s (and its reaction)", took)
	}
	if !hasEvent(n.events("web"), "RolledBack", "Version "+string(failing.UID)+" was not Ready within 20s") {
		t.Errorf("events: %+v", n.events("web"))
	}
	if b, err := os.ReadFile(filepath.Join(n.podsDir, "web.yaml")); err != nil || string(b) != bad {
		t.Errorf("the manifest was changed: %q, %v", b, err)
	}

	// A crash after the rollback: it holds, and the failed version does
	// not run again.
	n.kill9()
	n.start()
	n.waitPodFor("web", "still rolled back", 60*time.Second, func(p *v1.Pod) bool {
		return p.UID == good.UID && ready(p) && podConditionTrue(p, runner.ConditionRolledBack)
	})
	if cs := n.containers(string(failing.UID)); len(cs) != 0 {
		t.Errorf("the failed version has %d containers after the restart", len(cs))
	}
	// A manifest change runs again.
	pushWeb(t, reg.addr+"/app:3", "three")
	n.writeManifest("web.yaml", updatePod(slow.addr+"/app:3", "20s"))
	p = n.waitPodFor("web", "v3 Ready", 60*time.Second, func(p *v1.Pod) bool { return p.UID != good.UID && ready(p) })
	if podConditionTrue(p, runner.ConditionRolledBack) {
		t.Error("v3 carries the RolledBack condition")
	}
}

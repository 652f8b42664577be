package mirror

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/noderun/noderun/manifests"
)

// fakeAPI is an API server's logic for the calls the mirror makes:
// objects by path, UIDs and resourceVersions given as a server does.
type fakeAPI struct {
	mu    sync.Mutex
	seq   int
	nodes map[string]*v1.Node
	lease map[string]*coordv1.Lease
	pods  map[string]*v1.Pod // namespace/name
	calls []string           // "METHOD path"
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{nodes: map[string]*v1.Node{}, lease: map[string]*coordv1.Lease{}, pods: map[string]*v1.Pod{}}
}

func (f *fakeAPI) stamp(m *metav1.ObjectMeta) {
	f.seq++
	if m.UID == "" {
		m.UID = types.UID(fmt.Sprintf("uid-%d", f.seq))
	}
	m.ResourceVersion = fmt.Sprint(f.seq)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	body, _ := io.ReadAll(r.Body)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	notFound := func() { reply(404, metav1.Status{Status: "Failure", Code: 404, Reason: metav1.StatusReasonNotFound}) }
	switch {
	case r.URL.Path == "/api/v1/nodes" && r.Method == "POST":
		var n v1.Node
		_ = json.Unmarshal(body, &n)
		f.stamp(&n.ObjectMeta)
		f.nodes[n.Name] = &n
		reply(201, n)
	case len(parts) >= 4 && parts[2] == "nodes":
		n := f.nodes[parts[3]]
		if n == nil {
			notFound()
			return
		}
		if r.Method == "PATCH" {
			var p struct{ Status v1.NodeStatus }
			_ = json.Unmarshal(body, &p)
			n.Status = p.Status
		}
		reply(200, n)
	case strings.HasPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"):
		var l coordv1.Lease
		_ = json.Unmarshal(body, &l)
		switch r.Method {
		case "GET":
			if f.lease[parts[6]] == nil {
				notFound()
				return
			}
			reply(200, f.lease[parts[6]])
		case "POST", "PUT":
			f.stamp(&l.ObjectMeta)
			f.lease[l.Name] = &l
			reply(200, l)
		}
	case r.URL.Path == "/api/v1/pods":
		var list v1.PodList
		for _, p := range f.pods {
			if "spec.nodeName="+p.Spec.NodeName == r.URL.Query().Get("fieldSelector") {
				list.Items = append(list.Items, *p)
			}
		}
		reply(200, list)
	case len(parts) == 5 && r.Method == "POST": // api/v1/namespaces/ns/pods
		var p v1.Pod
		_ = json.Unmarshal(body, &p)
		p.UID = ""
		f.stamp(&p.ObjectMeta)
		p.Status = v1.PodStatus{Phase: v1.PodPending}
		f.pods[p.Namespace+"/"+p.Name] = &p
		reply(201, p)
	case len(parts) >= 6:
		key := parts[3] + "/" + parts[5]
		p := f.pods[key]
		if p == nil {
			notFound()
			return
		}
		switch r.Method {
		case "DELETE":
			var o metav1.DeleteOptions
			_ = json.Unmarshal(body, &o)
			if o.Preconditions == nil || *o.Preconditions.UID != p.UID || o.GracePeriodSeconds == nil || *o.GracePeriodSeconds != 0 {
				reply(409, metav1.Status{Code: 409, Message: "precondition"})
				return
			}
			delete(f.pods, key)
			reply(200, metav1.Status{Status: "Success"})
		case "PATCH":
			var patch struct {
				Metadata struct{ UID types.UID }
				Status   v1.PodStatus
			}
			_ = json.Unmarshal(body, &patch)
			if patch.Metadata.UID != p.UID {
				reply(409, metav1.Status{Code: 409, Message: "uid"})
				return
			}
			p.Status = patch.Status
			reply(200, p)
		}
	default:
		reply(404, metav1.Status{Code: 404, Message: "no route " + r.URL.Path})
	}
}

// fakeSource is the engine's side: static pods, a change channel, readiness.
type fakeSource struct {
	mu    sync.Mutex
	pods  []v1.Pod
	ready chan struct{}
}

func (s *fakeSource) Pods() []v1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]v1.Pod(nil), s.pods...)
}
func (s *fakeSource) Changes() (uint64, <-chan struct{}) { return 0, make(chan struct{}) }
func (s *fakeSource) Ready() <-chan struct{}             { return s.ready }
func (s *fakeSource) Node(context.Context) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"kubernetes.io/hostname": "n1"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}}}}
}

func staticPod(name, hash string) v1.Pod {
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-n1", Namespace: "kube-system", UID: types.UID(hash),
			Annotations: map[string]string{manifests.ConfigHashAnnotation: hash, manifests.ConfigSourceAnnotation: "file"}},
		Spec:   v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c", Image: "i"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.2"},
	}
}

// harness serves api over TLS and writes a kubeconfig for it with a token.
func harness(t *testing.T, api *fakeAPI, src *fakeSource) (*Mirror, *clocktesting.FakeClock, *[]string, *httptest.Server) {
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"+
		"clusters:\n- name: k\n  cluster: {server: %q, certificate-authority: ca.crt}\nusers:\n- name: u\n  user: {token: secret}\n", srv.URL)
	path := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var failures []string
	m := New(Config{Kubeconfig: path, NodeName: "n1", Source: src, Clock: clk, KubeletVersion: "v1.37.2", OnResult: func(op string, err error) {
		if err != nil {
			failures = append(failures, op+": "+err.Error())
		}
	}})
	return m, clk, &failures, srv
}

func TestMirrorRegistersNodeLeaseAndPods(t *testing.T) {
	api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{staticPod("etcd", "h1"), staticPod("kube-apiserver", "h2")}}
	// Left by an earlier run: a mirror pod of a static pod now gone, and a
	// pod the scheduler bound here, which is not the mirror's.
	api.pods["kube-system/old-n1"] = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "old-n1", Namespace: "kube-system", UID: "old",
		Annotations: map[string]string{ConfigMirrorAnnotation: "h0"}}, Spec: v1.PodSpec{NodeName: "n1"}}
	api.pods["default/web"] = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "web"}, Spec: v1.PodSpec{NodeName: "n1"}}
	m, clk, failures, _ := harness(t, api, src)
	ctx := context.Background()

	m.turn(ctx) // not ready: node and lease only
	if len(api.nodes) != 1 || len(api.lease) != 1 || len(api.pods) != 2 {
		t.Fatalf("before the sources are ready: %d nodes, %d leases, %d pods; want 1, 1, 2 (no pod touched)", len(api.nodes), len(api.lease), len(api.pods))
	}
	node := api.nodes["n1"]
	if node.Labels["kubernetes.io/hostname"] != "n1" || len(node.Status.Conditions) != 1 || node.Status.NodeInfo.KubeletVersion != "v1.37.2" {
		t.Errorf("node: %+v", node)
	}
	l := api.lease["n1"]
	if *l.Spec.HolderIdentity != "n1" || *l.Spec.LeaseDurationSeconds != 40 || !l.Spec.RenewTime.Time.Equal(clk.Now()) ||
		len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != node.UID {
		t.Errorf("lease: %+v", l)
	}

	close(src.ready)
	m.turn(ctx)
	if _, ok := api.pods["kube-system/old-n1"]; ok {
		t.Error("the orphaned mirror pod was not deleted")
	}
	if _, ok := api.pods["default/web"]; !ok {
		t.Error("a pod that is no mirror pod was deleted")
	}
	for _, name := range []string{"etcd-n1", "kube-apiserver-n1"} {
		mp := api.pods["kube-system/"+name]
		if mp == nil {
			t.Fatalf("no mirror pod %s", name)
		}
		hash := mp.Annotations[manifests.ConfigHashAnnotation]
		if mp.Annotations[ConfigMirrorAnnotation] != hash || mp.Annotations[manifests.ConfigSourceAnnotation] != "file" ||
			mp.Spec.NodeName != "n1" || len(mp.OwnerReferences) != 1 || mp.OwnerReferences[0].Kind != "Node" ||
			mp.OwnerReferences[0].UID != node.UID || mp.OwnerReferences[0].Controller == nil || !*mp.OwnerReferences[0].Controller {
			t.Errorf("mirror pod %s: %+v", name, mp.ObjectMeta)
		}
		if mp.Status.Phase != v1.PodRunning || mp.Status.PodIP != "10.0.0.2" {
			t.Errorf("mirror pod %s status: %+v", name, mp.Status)
		}
	}
	if len(*failures) != 0 {
		t.Errorf("failures: %q", *failures)
	}
}

func TestMirrorRecreatesReplacesAndDeletes(t *testing.T) {
	api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{staticPod("etcd", "h1"), staticPod("kube-scheduler", "h3")}}
	close(src.ready)
	m, _, failures, _ := harness(t, api, src)
	ctx := context.Background()
	m.turn(ctx)
	first := api.pods["kube-system/etcd-n1"].UID

	// kubectl delete: the pod is being deleted (graceful), or gone.
	now := metav1.Now()
	api.pods["kube-system/etcd-n1"].DeletionTimestamp = &now
	delete(api.pods, "kube-system/kube-scheduler-n1")
	// The manifest was edited: a new hash.
	src.pods[0] = staticPod("etcd", "h1b")
	m.turn(ctx)
	mp := api.pods["kube-system/etcd-n1"]
	if mp == nil || mp.UID == first || mp.DeletionTimestamp != nil || mp.Annotations[ConfigMirrorAnnotation] != "h1b" {
		t.Errorf("etcd's mirror pod after delete and edit: %+v", mp)
	}
	if api.pods["kube-system/kube-scheduler-n1"] == nil {
		t.Error("a deleted mirror pod did not come back")
	}
	if mp.Status.Phase != v1.PodRunning {
		t.Errorf("the new mirror pod's status: %+v", mp.Status)
	}

	// The manifest is removed.
	src.pods = src.pods[:1]
	m.turn(ctx)
	if api.pods["kube-system/kube-scheduler-n1"] != nil {
		t.Error("the mirror pod of a removed manifest is still there")
	}
	if len(*failures) != 0 {
		t.Errorf("failures: %q", *failures)
	}
}

// An edited manifest's old pod, torn down, is listed beside its new pod,
// in either order: the mirror pod is the new one's from the first turn
// on, with the new pod's status, and is not replaced again.
func TestMirrorNewPodOfAnEditedManifest(t *testing.T) {
	old, repl := staticPod("kube-scheduler", "h1"), staticPod("kube-scheduler", "h2")
	now := metav1.Now()
	old.DeletionTimestamp = &now
	repl.Status = v1.PodStatus{Phase: v1.PodPending}
	for _, order := range [][]v1.Pod{{old, repl}, {repl, old}} {
		api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{staticPod("kube-scheduler", "h1")}}
		close(src.ready)
		m, _, failures, _ := harness(t, api, src)
		ctx := context.Background()
		m.turn(ctx)
		src.pods = order
		m.turn(ctx)
		mp := api.pods["kube-system/kube-scheduler-n1"]
		if mp == nil || mp.Annotations[ConfigMirrorAnnotation] != "h2" || mp.Status.Phase != v1.PodPending {
			t.Fatalf("order %s first: mirror pod %+v", order[0].UID, mp)
		}
		src.pods = []v1.Pod{order[1], order[0]}
		m.turn(ctx)
		if got := api.pods["kube-system/kube-scheduler-n1"]; got.UID != mp.UID {
			t.Errorf("order %s first: the mirror pod was replaced at the next turn: %+v", order[0].UID, got.ObjectMeta)
		}
		if len(*failures) != 0 {
			t.Errorf("order %s first: failures %q", order[0].UID, *failures)
		}
	}

	// Before the old pod is marked terminating, both are listed as
	// running: the mirror pod stays the old one's until it is.
	running := staticPod("kube-scheduler", "h1")
	for _, order := range [][]v1.Pod{{running, repl}, {repl, running}} {
		api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{running}}
		close(src.ready)
		m, _, _, _ := harness(t, api, src)
		m.turn(context.Background())
		first := api.pods["kube-system/kube-scheduler-n1"].UID
		src.pods = order
		m.turn(context.Background())
		if mp := api.pods["kube-system/kube-scheduler-n1"]; mp.UID != first {
			t.Errorf("order %s first, neither terminating: the mirror pod was replaced: %+v", order[0].UID, mp.ObjectMeta)
		}
	}
}

func TestMirrorWritesOnlyWhatChanged(t *testing.T) {
	api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{staticPod("etcd", "h1")}}
	close(src.ready)
	m, clk, _, _ := harness(t, api, src)
	ctx := context.Background()
	m.turn(ctx)
	count := func(prefix string) int {
		n := 0
		for _, c := range api.calls {
			if strings.HasPrefix(c, prefix) {
				n++
			}
		}
		return n
	}
	api.calls = nil
	clk.Step(5 * time.Second)
	m.turn(ctx)
	if n := count("PUT /apis/coordination"); n != 0 {
		t.Errorf("lease renewed %d times 5 s after its renewal; want 0 (every 10 s)", n)
	}
	if n := count("PATCH"); n != 0 {
		t.Errorf("%d status writes with nothing changed: %q", n, api.calls)
	}
	clk.Step(5 * time.Second)
	src.pods[0].Status.Phase = v1.PodFailed
	m.turn(ctx)
	if count("PUT /apis/coordination") != 1 || count("PATCH /api/v1/namespaces/kube-system/pods/etcd-n1/status") != 1 {
		t.Errorf("10 s later, a pod changed: calls %q; want one lease renewal and one pod status", api.calls)
	}
	if api.pods["kube-system/etcd-n1"].Status.Phase != v1.PodFailed {
		t.Error("the changed status was not written")
	}
}

func TestMirrorOffline(t *testing.T) {
	api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{}), pods: []v1.Pod{staticPod("etcd", "h1")}}
	close(src.ready)
	m, _, failures, srv := harness(t, api, src)
	ctx := context.Background()

	// No kubeconfig yet: kubeadm writes it after the node agent started.
	conf := m.cfg.Kubeconfig
	b, _ := os.ReadFile(conf)
	_ = os.Remove(conf)
	m.turn(ctx)
	if len(*failures) != 1 || !strings.HasPrefix((*failures)[0], "connect: ") {
		t.Errorf("without a kubeconfig: failures %q; want one connect failure", *failures)
	}
	if err := os.WriteFile(conf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m.turn(ctx)
	if api.pods["kube-system/etcd-n1"] == nil {
		t.Fatal("no mirror pod once the kubeconfig is there")
	}

	// The server goes away: one failed call ends the turn.
	*failures = nil
	srv.Close()
	m.turn(ctx)
	if len(*failures) != 1 || !strings.Contains((*failures)[0], "connection refused") {
		t.Errorf("with the server down: failures %q; want the turn to end at its first call", *failures)
	}
}

func TestMirrorWrongCredentials(t *testing.T) {
	api, src := newFakeAPI(), &fakeSource{ready: make(chan struct{})}
	m, _, failures, srv := harness(t, api, src)
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(401)
		_ = json.NewEncoder(w).Encode(metav1.Status{Code: 401, Message: "Unauthorized"})
	})
	m.turn(context.Background())
	if len(*failures) != 1 || !strings.Contains((*failures)[0], "register: GET /api/v1/nodes/n1: 401 Unauthorized") {
		t.Errorf("failures %q", *failures)
	}
}

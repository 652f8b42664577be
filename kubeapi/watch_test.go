package kubeapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"

func phasePod(name string, phase v1.PodPhase) v1.Pod {
	p := testPod("default", name)
	p.Status.Phase = phase
	return p
}

// countingBackend counts lists, to prove idle watches do not poll.
type countingBackend struct {
	*fakeBackend
	lists atomic.Int64
}

func (c *countingBackend) Pods() []v1.Pod {
	c.lists.Add(1)
	return c.fakeBackend.Pods()
}

func startAPI(t *testing.T, b Backend) *httptest.Server {
	t.Helper()
	s := New(testCreds)
	s.Ready(b, nil)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, srv *httptest.Server, path, accept string) *http.Response {
	t.Helper()
	// Ended when the test ends (before the server closes, which waits
	// for open requests such as watches).
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+testCreds.ViewToken)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchEvents opens a watch and returns its events as they come.
func watchEvents(t *testing.T, srv *httptest.Server, path, accept string) <-chan event {
	t.Helper()
	resp := get(t, srv, path, accept)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch %s: %s", path, resp.Status)
	}
	ch := make(chan event, 100)
	go func() {
		defer resp.Body.Close()
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				ch <- ev
			}
		}
	}()
	return ch
}

func next(t *testing.T, ch <-chan event) (string, v1.Pod) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("watch ended")
		}
		var p v1.Pod
		_ = json.Unmarshal(ev.Object, &p)
		return ev.Type, p
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event")
	}
	return "", v1.Pod{}
}

func TestWatchPods(t *testing.T) {
	be := &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodPending)}}
	srv := startAPI(t, be)

	resp := get(t, srv, "/api/v1/namespaces/default/pods", "")
	var list v1.PodList
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if list.ResourceVersion == "" || len(list.Items) != 1 || list.Items[0].ResourceVersion == "" {
		t.Fatalf("list without resourceVersions: %+v", list.ListMeta)
	}

	// From the list's resourceVersion: only what changes after it.
	fromList := watchEvents(t, srv, "/api/v1/namespaces/default/pods?watch=true&resourceVersion="+list.ResourceVersion, "")
	// Without one: the current pods as ADDED first.
	fresh := watchEvents(t, srv, "/api/v1/pods?watch=1", "")
	if typ, p := next(t, fresh); typ != "ADDED" || p.Name != "a" || p.Kind != "Pod" {
		t.Fatalf("first event %s %s (kind %q), want ADDED a Pod", typ, p.Name, p.Kind)
	}
	// Only Running pods: a changes phase into view, then out of it.
	running := watchEvents(t, srv, "/api/v1/pods?watch=true&fieldSelector=status.phase%3DRunning", "")

	be.set([]v1.Pod{phasePod("a", v1.PodRunning)}, nil)
	for _, ch := range []<-chan event{fromList, fresh} {
		if typ, p := next(t, ch); typ != "MODIFIED" || p.Status.Phase != v1.PodRunning {
			t.Fatalf("after a change: %s %s", typ, p.Status.Phase)
		}
	}
	if typ, _ := next(t, running); typ != "ADDED" {
		t.Fatalf("pod came to match the selector: %s, want ADDED", typ)
	}
	be.set([]v1.Pod{phasePod("a", v1.PodSucceeded)}, nil)
	if typ, _ := next(t, running); typ != "DELETED" {
		t.Fatalf("pod stopped matching the selector: %s, want DELETED", typ)
	}
	if typ, p := next(t, fromList); typ != "MODIFIED" || p.Status.Phase != v1.PodSucceeded {
		t.Fatalf("second change: %s %s", typ, p.Status.Phase)
	}
	be.set(nil, nil)
	if typ, p := next(t, fromList); typ != "DELETED" || p.Name != "a" {
		t.Fatalf("pod removed: %s %s, want DELETED a", typ, p.Name)
	}
}

func TestWatchTooOld(t *testing.T) {
	be := &fakeBackend{}
	srv := startAPI(t, be)
	get(t, srv, "/api/v1/pods", "").Body.Close() // first sync
	for i := range historyLen + 10 {
		be.set([]v1.Pod{phasePod("a", v1.PodPhase("P"+string(rune('a'+i%26))))}, nil)
		get(t, srv, "/api/v1/pods", "").Body.Close()
	}
	ch := watchEvents(t, srv, "/api/v1/pods?watch=true&resourceVersion=2", "")
	ev := <-ch
	var st metav1.Status
	_ = json.Unmarshal(ev.Object, &st)
	if ev.Type != "ERROR" || st.Code != http.StatusGone || st.Reason != metav1.StatusReasonExpired {
		t.Fatalf("watch from a dropped resourceVersion: %s %+v, want ERROR 410 Expired", ev.Type, st)
	}
}

func TestWatchTimeoutSeconds(t *testing.T) {
	srv := startAPI(t, &fakeBackend{})
	start := time.Now()
	ch := watchEvents(t, srv, "/api/v1/pods?watch=true&timeoutSeconds=1", "")
	for range ch {
	}
	if d := time.Since(start); d < time.Second || d > 10*time.Second {
		t.Fatalf("watch with timeoutSeconds=1 lasted %s", d)
	}
}

// Open watches sleep until something changes: no listing while idle.
func TestIdleWatchesDoNotPoll(t *testing.T) {
	be := &countingBackend{fakeBackend: &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodRunning)}}}
	srv := startAPI(t, be)
	var chans []<-chan event
	for range 10 {
		ch := watchEvents(t, srv, "/api/v1/pods?watch=true", "")
		next(t, ch)
		chans = append(chans, ch)
	}
	before := be.lists.Load()
	time.Sleep(500 * time.Millisecond)
	if n := be.lists.Load() - before; n != 0 {
		t.Fatalf("%d lists by 10 idle watches in 0.5s", n)
	}
	be.set([]v1.Pod{phasePod("a", v1.PodSucceeded)}, nil)
	for _, ch := range chans {
		if typ, _ := next(t, ch); typ != "MODIFIED" {
			t.Fatalf("got %s, want MODIFIED", typ)
		}
	}
	if n := be.lists.Load() - before; n != 1 {
		t.Errorf("one change made %d lists, want 1 for all 10 watches", n)
	}
}

// follow, which keeps the history for resumed watches and the pod start
// metric, syncs at most every followEvery: a burst of changes costs a few
// lists of every pod, not one per change, and the last change is synced
// all the same.
func TestFollowCoalescesBursts(t *testing.T) {
	be := &countingBackend{fakeBackend: &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodPending)}}}
	s := New(testCreds)
	s.Ready(be, nil)
	deadline := time.Now().Add(30 * time.Second)
	for be.lists.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(2 * followEvery) // the next change is a lone one
	before := be.lists.Load()
	start := time.Now()
	const changes = 40
	for i := range changes {
		p := phasePod("a", v1.PodPending)
		p.Labels = map[string]string{"i": strconv.Itoa(i)}
		be.set([]v1.Pod{p}, nil)
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for {
		pods, _ := s.pods.store.snapshot()
		if len(pods) == 1 && pods[0].Labels["i"] == strconv.Itoa(changes-1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last change never synced: %+v", pods)
		}
		time.Sleep(time.Millisecond)
	}
	// One at the first change, then at most one per followEvery, and the
	// last after the changes stopped.
	if n, most := be.lists.Load()-before, int64(elapsed/followEvery)+2; n > most {
		t.Errorf("%d changes in %s made %d lists, want at most %d", changes, elapsed.Round(time.Millisecond), n, most)
	}
}

func TestListAsTable(t *testing.T) {
	srv := startAPI(t, &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodRunning), phasePod("b", v1.PodPending)}})
	resp := get(t, srv, "/api/v1/namespaces/default/pods?labelSelector=", tableAccept)
	defer resp.Body.Close()
	var tbl metav1.Table
	if err := json.NewDecoder(resp.Body).Decode(&tbl); err != nil {
		t.Fatal(err)
	}
	if tbl.Kind != "Table" || tbl.APIVersion != "meta.k8s.io/v1" || len(tbl.Rows) != 2 || len(tbl.ColumnDefinitions) != 9 {
		t.Fatalf("table %s/%s with %d rows, %d columns", tbl.APIVersion, tbl.Kind, len(tbl.Rows), len(tbl.ColumnDefinitions))
	}
	var meta metav1.PartialObjectMetadata
	if err := json.Unmarshal(tbl.Rows[0].Object.Raw, &meta); err != nil || meta.Kind != "PartialObjectMetadata" || meta.Name != "a" {
		t.Errorf("row object %s (%v), want the pod's metadata", tbl.Rows[0].Object.Raw, err)
	}

	// A watch as Table: each event carries a one-row table.
	ch := watchEvents(t, srv, "/api/v1/pods?watch=true", tableAccept)
	ev := <-ch
	if err := json.Unmarshal(ev.Object, &tbl); err != nil || tbl.Kind != "Table" || len(tbl.Rows) != 1 {
		t.Fatalf("watch event as Table: %s", ev.Object)
	}
}

func TestSelectorErrors(t *testing.T) {
	srv := startAPI(t, &fakeBackend{})
	for _, path := range []string{
		"/api/v1/pods?fieldSelector=spec.nope%3Dx",
		"/api/v1/pods?labelSelector=a%20in%20(",
		"/api/v1/events?fieldSelector=status.phase%3DRunning",
		"/api/v1/pods?watch=maybe",
	} {
		resp := get(t, srv, path, "")
		var st metav1.Status
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || st.Reason != metav1.StatusReasonBadRequest {
			t.Errorf("%s: %s %q, want 400 BadRequest", path, resp.Status, st.Message)
		}
	}
}

func TestEventFieldSelectors(t *testing.T) {
	ev := func(name, pod string) v1.Event {
		return v1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod, UID: types.UID("uid-" + pod)}}
	}
	srv := startAPI(t, &fakeBackend{events: []v1.Event{ev("e1", "web"), ev("e2", "db")}})
	resp := get(t, srv, "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dweb,involvedObject.namespace%3Ddefault,involvedObject.uid%3Duid-web,involvedObject.kind%3DPod", "")
	var list v1.EventList
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Items) != 1 || list.Items[0].Name != "e1" {
		t.Fatalf("events of pod web: %+v", list.Items)
	}
}

func TestAggregatedDiscovery(t *testing.T) {
	srv := startAPI(t, &fakeBackend{})
	// What kubectl sends.
	const accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
	resp := get(t, srv, "/api", accept)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != aggregatedType {
		t.Fatalf("Content-Type %q, want %q", ct, aggregatedType)
	}
	var list struct {
		Items []struct {
			Versions []struct {
				Version   string `json:"version"`
				Resources []struct {
					Resource     string `json:"resource"`
					Subresources []struct {
						Subresource string `json:"subresource"`
					} `json:"subresources"`
				} `json:"resources"`
			} `json:"versions"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	subs := map[string]bool{}
	for _, r := range list.Items[0].Versions[0].Resources {
		if r.Resource == "pods" {
			for _, s := range r.Subresources {
				subs[s.Subresource] = true
			}
		}
	}
	for _, s := range []string{"log", "exec", "attach", "portforward"} {
		if !subs[s] {
			t.Errorf("pods/%s missing from aggregated discovery", s)
		}
	}
	legacy := get(t, srv, "/api", "application/json")
	legacy.Body.Close()
	if ct := legacy.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("legacy discovery Content-Type %q", ct)
	}
	if resp := get(t, srv, "/version", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("/version: %s", resp.Status)
	}
}

// A watch-list (client-go's informers may ask for one) gets every object,
// then the bookmark that ends the initial events.
func TestWatchListInitialEvents(t *testing.T) {
	srv := startAPI(t, &fakeBackend{pods: []v1.Pod{phasePod("a", v1.PodRunning), phasePod("b", v1.PodRunning)}})
	ch := watchEvents(t, srv, "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", "")
	for range 2 {
		if typ, _ := next(t, ch); typ != "ADDED" {
			t.Fatalf("initial event %s, want ADDED", typ)
		}
	}
	typ, p := next(t, ch)
	if typ != "BOOKMARK" || p.Annotations[metav1.InitialEventsAnnotationKey] != "true" || p.ResourceVersion == "" {
		t.Fatalf("after the initial events: %s %+v, want the initial-events-end bookmark", typ, p.ObjectMeta)
	}
}

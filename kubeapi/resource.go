package kubeapi

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// resource serves one kind of object: list, get and watch, as JSON or as
// the API server's Table.
type resource[T any] struct {
	name, kind string
	store      *store[T]
	// fields are the object's values for field selectors; a selector on
	// any other field is refused, as the API server refuses it.
	fields     func(*T) fields.Set
	columns    []metav1.TableColumnDefinition
	cells      func(*T, time.Time) []any
	conditions func(*T) []metav1.TableRowCondition
	now        func() time.Time
	// redact, if set, is an object as the view token sees it.
	redact func(T) T
}

// viewer is how the request's token sees objects: the admin token as they
// are, the view token through redact.
func (res *resource[T]) viewer(r *http.Request) func(T) T {
	if res.redact == nil || roleOf(r) == roleAdmin {
		return func(obj T) T { return obj }
	}
	return res.redact
}

// query is what a list or watch request asks for.
type query struct {
	namespace string
	labels    labels.Selector
	fields    fields.Selector
	table     bool
	include   metav1.IncludeObjectPolicy
	watch     bool
	from      uint64 // resourceVersion to watch from (0: now, with ADDED)
	timeout   time.Duration
	// initialEvents: the client's watch-list (sendInitialEvents=true)
	// wants every object ADDED, then a bookmark marking their end.
	initialEvents bool
}

func (res *resource[T]) parse(r *http.Request) (*query, *metav1.Status) {
	v := r.URL.Query()
	q := &query{namespace: r.PathValue("namespace"), labels: labels.Everything(), fields: fields.Everything()}
	var err error
	if s := v.Get("labelSelector"); s != "" {
		if q.labels, err = labels.Parse(s); err != nil {
			return nil, badRequest("unable to parse requirement: " + err.Error())
		}
	}
	if s := v.Get("fieldSelector"); s != "" {
		if q.fields, err = fields.ParseSelector(s); err != nil {
			return nil, badRequest(err.Error())
		}
		known := res.fields(new(T))
		for _, req := range q.fields.Requirements() {
			if _, ok := known[req.Field]; !ok {
				return nil, badRequest(fmt.Sprintf("field label not supported: %s", req.Field))
			}
		}
	}
	if q.table, q.include, err = negotiateTable(r); err != nil {
		return nil, status(http.StatusNotAcceptable, metav1.StatusReasonNotAcceptable, err.Error())
	}
	switch v.Get("watch") {
	case "", "false", "0":
	case "true", "1":
		q.watch = true
	default:
		return nil, badRequest("watch: want true or false, not " + strconv.Quote(v.Get("watch")))
	}
	if s := v.Get("resourceVersion"); q.watch && s != "" {
		if q.from, err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, badRequest("resourceVersion: " + strconv.Quote(s) + " is not a resource version of this server")
		}
	}
	if v.Get("sendInitialEvents") == "true" {
		q.initialEvents, q.from = true, 0
	}
	if s := v.Get("timeoutSeconds"); s != "" {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, badRequest("timeoutSeconds: " + strconv.Quote(s) + " is not a number of seconds")
		}
		q.timeout = time.Duration(n) * time.Second
	}
	return q, nil
}

// negotiateTable reads Accept: a Table (meta.k8s.io/v1) when the client
// asks for one first, plain JSON otherwise.
func negotiateTable(r *http.Request) (bool, metav1.IncludeObjectPolicy, error) {
	include := metav1.IncludeMetadata
	switch p := metav1.IncludeObjectPolicy(r.URL.Query().Get("includeObject")); p {
	case "":
	case metav1.IncludeNone, metav1.IncludeMetadata, metav1.IncludeObject:
		include = p
	default:
		return false, "", fmt.Errorf("includeObject: %q is none of None, Metadata, Object", p)
	}
	accept := r.Header.Get("Accept")
	if accept == "" {
		return false, include, nil
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch {
		case mt != "application/json" && mt != "*/*" && mt != "application/*":
		case params["as"] == "Table" && params["g"] == "meta.k8s.io" && params["v"] == "v1":
			return true, include, nil
		case params["as"] == "":
			return false, include, nil
		}
	}
	return false, "", fmt.Errorf("only application/json and application/json;as=Table;g=meta.k8s.io;v=v1 are served, not %q", accept)
}

func (res *resource[T]) matches(q *query, obj *T) bool {
	f := res.fields(obj)
	if q.namespace != "" && f["metadata.namespace"] != q.namespace {
		return false
	}
	return q.fields.Matches(f) && q.labels.Matches(labels.Set(res.store.meta(obj).Labels))
}

// object is obj with its kind and apiVersion, which single objects and
// watch events carry (list items do not).
func (res *resource[T]) object(obj T) runtime.Object {
	o := any(&obj).(runtime.Object)
	o.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: res.kind})
	return o
}

func (res *resource[T]) table(items []T, rv uint64, include metav1.IncludeObjectPolicy) *metav1.Table {
	now := res.now()
	t := &metav1.Table{
		TypeMeta:          metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"},
		ListMeta:          metav1.ListMeta{ResourceVersion: rvString(rv)},
		ColumnDefinitions: res.columns,
		Rows:              make([]metav1.TableRow, 0, len(items)),
	}
	for i := range items {
		row := metav1.TableRow{Cells: res.cells(&items[i], now)}
		if res.conditions != nil {
			row.Conditions = res.conditions(&items[i])
		}
		switch include {
		case metav1.IncludeObject:
			row.Object = runtime.RawExtension{Object: res.object(items[i])}
		case metav1.IncludeMetadata:
			row.Object = runtime.RawExtension{Object: &metav1.PartialObjectMetadata{
				TypeMeta:   metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"},
				ObjectMeta: *res.store.meta(&items[i]),
			}}
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func rvString(rv uint64) string { return strconv.FormatUint(rv, 10) }

func (res *resource[T]) serveList(s *Server) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, st := res.parse(r)
		if st != nil {
			writeStatus(w, st)
			return
		}
		s.sync()
		if q.watch {
			release, ok := s.limits.acquire(w, roleOf(r), watches)
			if !ok {
				return
			}
			defer release()
			res.serveWatch(s, w, r, q)
			return
		}
		all, rv := res.store.snapshot()
		view := res.viewer(r)
		items := make([]T, 0, len(all))
		for i := range all {
			if res.matches(q, &all[i]) {
				items = append(items, view(all[i]))
			}
		}
		if q.table {
			writeJSON(w, http.StatusOK, res.table(items, rv, q.include))
			return
		}
		writeJSON(w, http.StatusOK, &list[T]{
			TypeMeta: metav1.TypeMeta{Kind: res.kind + "List", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: rvString(rv)},
			Items:    items,
		})
	}
}

type list[T any] struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []T `json:"items"`
}

// serveGet answers GET .../{name} (namespaced or not).
func (res *resource[T]) serveGet(s *Server) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, st := res.parse(r)
		if st != nil {
			writeStatus(w, st)
			return
		}
		s.sync()
		name := r.PathValue("name")
		all, _ := res.store.snapshot()
		for i := range all {
			m := res.store.meta(&all[i])
			if m.Name != name || m.Namespace != q.namespace {
				continue
			}
			obj := res.viewer(r)(all[i])
			if q.table {
				rv, _ := strconv.ParseUint(m.ResourceVersion, 10, 64)
				writeJSON(w, http.StatusOK, res.table([]T{obj}, rv, q.include))
				return
			}
			writeJSON(w, http.StatusOK, res.object(obj))
			return
		}
		writeStatus(w, notFound(res.name, name))
	}
}

// serveWatch streams changes until the client goes, falls too far behind,
// takes longer than writeTimeout to take a write, or its timeoutSeconds
// pass: without them, a random time between minWatchTimeout and twice it,
// as the API server does.
func (res *resource[T]) serveWatch(s *Server, w http.ResponseWriter, r *http.Request, q *query) {
	initial, wt, at, expired := res.store.watch(q.from)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	sw := newStreamWriter(w, s.writeTimeout)
	defer sw.done()
	sw.begin()
	enc := json.NewEncoder(sw)
	if expired != nil {
		st := status(http.StatusGone, metav1.StatusReasonExpired,
			fmt.Sprintf("too old resource version: %d (%d)", expired.rv, expired.oldest))
		_ = enc.Encode(&metav1.WatchEvent{Type: string(watch.Error), Object: runtime.RawExtension{Object: st}})
		return
	}
	defer res.store.stopWatch(wt)
	send := res.watchSender(r, q, enc)
	for _, c := range initial {
		if !send(c) {
			return
		}
	}
	if q.initialEvents && !res.initialEventsEnd(enc, at) {
		return
	}
	if sw.flush() != nil {
		return
	}
	res.followWatch(s, r, q, wt, sw, send)
}

// watchSender returns the function that encodes a change as the watch
// event q's client sees, if any; it reports false once a write failed.
func (res *resource[T]) watchSender(r *http.Request, q *query, enc *json.Encoder) func(change[T]) bool {
	view := res.viewer(r)
	return func(c change[T]) bool {
		typ, ok := res.visible(q, c)
		if !ok {
			return true
		}
		seen := view(c.obj)
		var obj runtime.Object = res.object(seen)
		if q.table {
			obj = res.table([]T{seen}, c.rv, q.include)
		}
		return enc.Encode(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Object: obj}}) == nil
	}
}

// followWatch sends wt's changes, as they come, until the watch ends (see
// serveWatch).
func (res *resource[T]) followWatch(s *Server, r *http.Request, q *query, wt *watcher[T], sw *streamWriter, send func(change[T]) bool) {
	timeout := q.timeout
	if timeout == 0 {
		timeout = s.watchTimeout()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	_, changed := s.be().Changes()
	for {
		select {
		case c, ok := <-wt.ch:
			if !ok {
				return // fell behind; the client watches again
			}
			sw.begin()
			if !send(c) {
				return
			}
			// Send what else is queued before flushing once.
			for more := true; more; {
				select {
				case c, ok := <-wt.ch:
					if !ok || !send(c) {
						return
					}
				default:
					more = false
				}
			}
			if sw.flush() != nil {
				return
			}
		case <-changed:
			// Whichever watch wakes first brings the stores up to date
			// for all; the others find nothing to do.
			_, changed = s.be().Changes()
			s.sync()
		case <-timer.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// visible is how a change looks through a watch's selectors: an object
// that starts or stops matching is ADDED or DELETED, as the API server
// shows it.
func (res *resource[T]) visible(q *query, c change[T]) (watch.EventType, bool) {
	now := res.matches(q, &c.obj)
	if c.typ != watch.Modified {
		return c.typ, now
	}
	before := res.matches(q, c.prev)
	switch {
	case now && before:
		return watch.Modified, true
	case now:
		return watch.Added, true
	case before:
		return watch.Deleted, true
	}
	return "", false
}

// initialEventsEnd sends the bookmark that ends a watch-list's initial
// events, at the resourceVersion they were taken at, as the API server does.
func (res *resource[T]) initialEventsEnd(enc *json.Encoder, rv uint64) bool {
	var obj T
	m := res.store.meta(&obj)
	m.ResourceVersion = rvString(rv)
	m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	return enc.Encode(&metav1.WatchEvent{Type: string(watch.Bookmark), Object: runtime.RawExtension{Object: res.object(obj)}}) == nil
}

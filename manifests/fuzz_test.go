package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
)

// FuzzDecode feeds arbitrary bytes through what a source does with a file:
// decode, default, validate. Nothing may panic, every problem must be a
// *ManifestError on a line of the input, and an accepted pod must survive
// defaulting twice unchanged. The seed corpus (conformance manifests,
// testdata) runs in plain `go test`.
func FuzzDecode(f *testing.F) {
	for _, pattern := range []string{filepath.Join(conformanceDir, "*.yaml"), "testdata/*.yaml", "testdata/*.json"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("--- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n---\n"))
	f.Add([]byte("apiVersion: v1\nkind: PodList\nitems: [{kind: Service}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := bytes.Count(data, []byte("\n")) + 1
		docs, errs := decodeDocuments(data)
		for _, d := range docs {
			ApplyDefaults(d.pod)
			errs = append(errs, Validate(d.pod)...)
			before := d.pod.DeepCopy()
			ApplyDefaults(d.pod)
			if !equality.Semantic.DeepEqual(before, d.pod) {
				t.Errorf("defaulting twice changed the pod")
			}
		}
		for _, err := range errs {
			var me *ManifestError
			if !errors.As(err, &me) {
				t.Fatalf("%v is not a *ManifestError", err)
			}
			if me.Line < 0 || me.Line > lines {
				t.Errorf("%v: line %d outside the input's %d lines", err, me.Line, lines)
			}
		}
	})
}

// FuzzURLResponse serves arbitrary answers (status, ETag, Last-Modified,
// body) to a URL source over HTTP, twice. Nothing may panic; a non-2xx
// answer or a body with no document is one specific error and no pods;
// every other problem is a *ManifestError naming the URL as shown, never
// its query secret, on a line of the body; pods get their final name and a
// UID that can name directories; and the same answer again changes nothing.
func FuzzURLResponse(f *testing.F) {
	for _, file := range []string{"testdata/web.yaml", "testdata/list.json", "testdata/typo.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(200, `"v1"`, "", data)
	}
	f.Add(200, "", "Mon, 02 Jan 2006 15:04:05 GMT", []byte("---\n# nothing\n"))
	f.Add(304, `"v1"`, "", []byte{})
	f.Add(502, "", "", []byte("bad gateway"))
	f.Add(200, "", "", []byte("apiVersion: v1\nkind: PodList\nitems: []\n"))
	f.Add(200, "", "", []byte("{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\",\"uid\":\"../x\"}}"))

	var mu sync.Mutex
	answers := map[string]urlAnswer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := answers[r.URL.Path]
		mu.Unlock()
		if validHeaderValue(a.etag) {
			w.Header().Set("ETag", a.etag)
		}
		if validHeaderValue(a.lastModified) {
			w.Header().Set("Last-Modified", a.lastModified)
		}
		w.WriteHeader(a.status)
		w.Write(a.body)
	}))
	defer srv.Close()
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, status int, etag, lastModified string, body []byte) {
		status = 200 + (status%400+400)%400 // 1xx are interim answers, not answers
		path := fmt.Sprintf("/%d", n.Add(1))
		mu.Lock()
		answers[path] = urlAnswer{status, etag, lastModified, body}
		mu.Unlock()
		defer func() { mu.Lock(); delete(answers, path); mu.Unlock() }()

		const secret = "s3cretQ"
		s, err := NewURLSource(srv.URL+path+"?token="+secret, "node1", WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer s.client.CloseIdleConnections() // a client per run: keep no descriptors
		r := &urlRun{URLSource: s}
		r.poll(context.Background())
		snap, fp := r.snapshot()
		r.poll(context.Background())
		if _, fp2 := r.snapshot(); fp2 != fp {
			t.Errorf("the same answer again changed the snapshot:\n%s\nthen\n%s", fp, fp2)
		}

		shown := srv.URL + path + "?token=xxxxx"
		lines := bytes.Count(body, []byte("\n")) + 1
		for _, err := range snap.Errors {
			var me *ManifestError
			if !errors.As(err, &me) || me.File != shown || me.Line < 0 || me.Line > lines {
				t.Errorf("error %v: not a *ManifestError of %s on one of %d lines", err, shown, lines)
			}
			if strings.Contains(err.Error(), secret) && !bytes.Contains(body, []byte(secret)) {
				t.Errorf("error %v shows the URL's query", err)
			}
		}
		switch {
		case status < 200 || status > 299:
			if len(snap.Errors) != 1 || !errors.Is(snap.Errors[0], ErrHTTPStatus) || !snap.Unavailable {
				t.Errorf("status %d: errors %v, unavailable %v", status, snap.Errors, snap.Unavailable)
			}
		case status == http.StatusNoContent || emptyManifest(body): // 204 carries no body
			if len(snap.Errors) != 1 || !errors.Is(snap.Errors[0], ErrEmptyBody) || !snap.Unavailable {
				t.Errorf("empty body: errors %v, unavailable %v", snap.Errors, snap.Unavailable)
			}
		default:
			// A client sees header values trimmed, and only valid ones.
			etag, lastModified = sent(etag), sent(lastModified)
			if snap.Info.ETag != etag || snap.Info.LastModified != lastModified {
				t.Errorf("ETag %q, Last-Modified %q kept, served %q, %q", snap.Info.ETag, snap.Info.LastModified, etag, lastModified)
			}
		}
		for _, p := range snap.Pods {
			if !strings.HasSuffix(p.Name, "-node1") || CheckUID(string(p.UID)) != nil {
				t.Errorf("pod %q with UID %q", p.Name, p.UID)
			}
		}
	})
}

type urlAnswer struct {
	status             int
	etag, lastModified string
	body               []byte
}

// validHeaderValue is what HTTP can carry in a header value (RFC 9110
// field-value): no control characters but tab.
func validHeaderValue(v string) bool {
	return !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f })
}

// sent is v as a client reads it back from a header: trimmed, or nothing.
func sent(v string) string {
	if !validHeaderValue(v) {
		return ""
	}
	return textproto.TrimString(v)
}

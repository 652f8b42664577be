package containerd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	v1 "k8s.io/api/core/v1"
)

// The errors a pull gets from containerd's resolver, through noderun's
// own transport, against real servers: only a registry that answered and
// refused is believed; one that could not serve may fall back.
func TestUnreachableClassification(t *testing.T) {
	status := func(code int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) })
	}
	for _, tc := range []struct {
		name     string
		tls      bool // a TLS server with a certificate of an unknown CA
		portal   bool // a plain HTTP server where https is expected (a captive portal)
		h        http.Handler
		fallback bool
	}{
		{name: "503", h: status(http.StatusServiceUnavailable), fallback: true},
		{name: "500", h: status(http.StatusInternalServerError), fallback: true},
		{name: "502", h: status(http.StatusBadGateway), fallback: true},
		{name: "429", h: status(http.StatusTooManyRequests), fallback: true},
		{name: "unknown CA", tls: true, h: status(http.StatusOK), fallback: true},
		{name: "captive portal", portal: true, h: status(http.StatusOK), fallback: true},
		{name: "401", h: status(http.StatusUnauthorized)},
		{name: "403", h: status(http.StatusForbidden)},
		{name: "404", h: status(http.StatusNotFound)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(tc.h)
			if tc.tls {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			defer srv.Close()
			host := strings.TrimPrefix(strings.TrimPrefix(srv.URL, "https://"), "http://")
			// The registry's name is not loopback, which containerd would
			// reach without verifying; hosts.toml sends it here.
			cfgDir := t.TempDir()
			scheme := "http"
			if tc.tls || tc.portal {
				scheme = "https"
			}
			hostsToml(t, cfgDir, "registry.example", fmt.Sprintf("server = %q\n", scheme+"://"+host), map[string][]byte{})
			rt := &Runtime{registry: RegistryConfig{ConfigDir: cfgDir}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _, err := rt.resolver(ctx, &progress{}).Resolve(ctx, "registry.example/app:1")
			if err == nil {
				t.Fatal("resolved")
			}
			if got := unreachable(fmt.Errorf("%w: %s: %w", ErrImagePull, "registry.example/app:1", err)); got != tc.fallback {
				t.Fatalf("unreachable(%v) = %t, want %t", err, got, tc.fallback)
			}
		})
	}
}

// An imagePullPolicy: Always pull runs the local copy when the registry
// answers 503 (to the manifest, or only to the blobs of a newer image) or
// presents a certificate of an unknown CA; it does not when the registry
// refuses (401). Refreshing the image in the background stops once no
// container is made from it.
func TestPullFallbackWhenTheRegistryCannotServe(t *testing.T) {
	rt := testRuntime(t)
	rt.pullFallback = true
	rt.refresh.min, rt.refresh.max = 50*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfgDir := t.TempDir()
	rt.registry.ConfigDir = cfgDir
	var requests atomic.Int32
	counted := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1); h.ServeHTTP(w, r) })
	}
	status := func(code int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) })
	}
	// A registry with a newer image than the local copy, behind a proxy
	// that serves its manifests but not its blobs.
	regAddr := freeAddr(t)
	serveRegistry(t, regAddr, t.TempDir())
	pushFrom(t, rt, regAddr+"/app:1", "v2")
	// Its content must be fetched: containerd shares blobs between
	// namespaces.
	pushCtx := namespaces.WithNamespace(context.Background(), "push-v2")
	if err := rt.client.ImageService().Delete(pushCtx, regAddr+"/app:1", images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	upstream, _ := url.Parse("http://" + regAddr)
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	noBlobs := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	for _, tc := range []struct {
		name     string
		tls      bool
		h        http.Handler
		fallback bool
	}{
		{name: "503", h: status(http.StatusServiceUnavailable), fallback: true},
		{name: "unknown CA", tls: true, h: status(http.StatusOK), fallback: true},
		{name: "blobs 503", h: noBlobs, fallback: true},
		{name: "401", h: status(http.StatusUnauthorized)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(counted(tc.h))
			scheme := "http"
			if tc.tls {
				srv.StartTLS()
				scheme = "https"
			} else {
				srv.Start()
			}
			defer srv.Close()
			host := strings.ReplaceAll(strings.ToLower(tc.name), " ", "-") + ".example"
			hostsToml(t, cfgDir, host, fmt.Sprintf("server = %q\n", scheme+"://"+srv.Listener.Addr().String()), map[string][]byte{})
			name := host + "/app:1"
			path := filepath.Join(t.TempDir(), "img.tar")
			busyboxTar(t, path, name)
			if _, err := ImportArchive(rt.ctx(ctx), rt.client, path, testSnapshotter); err != nil {
				t.Fatal(err)
			}
			img, err := rt.EnsureImage(ctx, name, v1.PullAlways)
			if !tc.fallback {
				if !errors.Is(err, ErrImagePull) {
					t.Fatalf("registry refused: %+v %v; want ErrImagePull", img, err)
				}
				return
			}
			if err != nil || img.PullFallback == "" {
				t.Fatalf("registry cannot serve: %+v %v; want the local copy with a fallback reason", img, err)
			}
			// No container is made from it: the refresh ends before
			// asking the registry again.
			asked := requests.Load()
			deadline := time.Now().Add(30 * time.Second)
			for refreshing(rt, img.Ref) {
				if time.Now().After(deadline) {
					t.Fatalf("still refreshing %s, which no container uses", img.Ref)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if n := requests.Load(); n != asked {
				t.Fatalf("the refresh asked the registry %d more times for an image no container uses", n-asked)
			}
		})
	}
}

func refreshing(rt *Runtime, name string) bool {
	rt.refresh.mu.Lock()
	defer rt.refresh.mu.Unlock()
	return rt.refresh.pending[name]
}

// useImage makes a container record from the image name, as a pod's
// container would be.
func useImage(t *testing.T, rt *Runtime, name string) {
	t.Helper()
	ctx := rt.ctx(context.Background())
	c, err := rt.client.NewContainer(ctx, "uses-"+strings.NewReplacer("/", "-", ":", "-").Replace(name), ctrd.WithImageName(name), ctrd.WithSpec(&oci.Spec{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(rt.ctx(context.Background())) })
}

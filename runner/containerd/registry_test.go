package containerd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"golang.org/x/crypto/bcrypt"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
)

// secureRegistry runs docker-registry on loopback with TLS from a fresh CA
// and htpasswd auth for user/pass; it returns host:port and the CA's PEM.
func secureRegistry(t *testing.T, user, pass string) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := testCerts(t)
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM, "htpasswd": []byte(user + ":" + string(hash) + "\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	runRegistry(t, dir, fmt.Sprintf(`version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: %[1]s/data}}
auth: {htpasswd: {realm: test, path: %[1]s/htpasswd}}
http:
  addr: %[2]s
  tls: {certificate: %[1]s/server.crt, key: %[1]s/server.key}
`, dir, addr), addr)
	return addr, caPEM
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// testCerts makes a CA and a server certificate for 127.0.0.1.
func testCerts(t *testing.T) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, srvKey := key(), key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// hostsToml writes <dir>/<host>/hosts.toml (and files beside it).
func hostsToml(t *testing.T, dir, host, content string, files map[string][]byte) {
	t.Helper()
	d := filepath.Join(dir, host) // containerd's layout: <config_path>/<host[:port]>/hosts.toml
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	files["hosts.toml"] = []byte(content)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(d, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func authFile(t *testing.T, host, user, pass string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// pushAs imports a busybox image named name and pushes it with rt's
// registry settings, then forgets it locally.
func pushAs(t *testing.T, rt *Runtime, name string) {
	t.Helper()
	ctx := rt.ctx(context.Background())
	path := filepath.Join(t.TempDir(), "push.tar")
	busyboxTar(t, path, name)
	if _, err := ImportArchive(ctx, rt.client, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	img, err := rt.client.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.client.Push(ctx, name, img.Target(), ctrd.WithResolver(rt.resolver(ctx, nil))); err != nil {
		t.Fatalf("push %s: %v", name, err)
	}
	if err := rt.client.ImageService().Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// A hosts.toml mirror serves docker.io images; TLS trusts the CA named
// there; credentials come from a docker config.json; a wrong password is a
// clear ErrImagePull naming the host.
func TestRegistryMirrorTLSAndAuth(t *testing.T) {
	rt := testRuntime(t)
	addr, ca := secureRegistry(t, "noderun", "s3cret")
	cfgDir := t.TempDir()
	mirror := fmt.Sprintf("server = \"https://registry-1.docker.io\"\n[host.\"https://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"ca.crt\"\n", addr)
	hostsToml(t, cfgDir, "docker.io", mirror, map[string][]byte{"ca.crt": ca})
	hostsToml(t, cfgDir, addr, fmt.Sprintf("[host.\"https://%s\"]\n  ca = \"ca.crt\"\n", addr), map[string][]byte{"ca.crt": ca})
	rt.registry = RegistryConfig{ConfigDir: cfgDir, AuthFiles: []string{"/nonexistent/config.json", authFile(t, addr, "noderun", "s3cret")}}
	pushAs(t, rt, addr+"/library/busybox:mirrored")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// docker.io's name resolves through the mirror: nothing leaves loopback.
	img, err := rt.EnsureImage(ctx, "busybox:mirrored", v1.PullAlways)
	if err != nil {
		t.Fatalf("pull through the mirror: %v", err)
	}
	if img.Ref != "docker.io/library/busybox:mirrored" {
		t.Errorf("image %s", img.Ref)
	}

	rt.registry.AuthFiles = []string{authFile(t, addr, "noderun", "wrong")}
	_, err = rt.EnsureImage(ctx, addr+"/library/busybox:mirrored", v1.PullAlways)
	if !errors.Is(err, ErrImagePull) || !strings.Contains(err.Error(), addr) || !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
		t.Fatalf("wrong password: %v; want ErrImagePull naming %s and unauthorized", err, addr)
	}
}

// A registry that accepts connections and never answers is given up on
// after the progress timeout, with the host named.
func TestPullStallTimeout(t *testing.T) {
	rt := testRuntime(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	rt.registry = RegistryConfig{ProgressTimeout: time.Second}
	start := time.Now()
	_, err = rt.EnsureImage(context.Background(), l.Addr().String()+"/stuck:1", v1.PullAlways)
	took := time.Since(start)
	if !errors.Is(err, ErrImagePull) || !strings.Contains(err.Error(), "no progress from "+l.Addr().String()) {
		t.Fatalf("stalled registry: %v", err)
	}
	if !unreachable(err) {
		t.Errorf("a stalled pull may not fall back to the local copy: %v", err)
	}
	if took > 30*time.Second { // not stuck with the registry; generous for a busy machine
		t.Fatalf("gave up after %s; the progress timeout is 1s", took)
	}
}

// Concurrent pulls of one image are one pull, and the last caller to go
// away cancels it.
func TestConcurrentPullsAreOne(t *testing.T) {
	rt := testRuntime(t)
	var started atomic.Int32
	release := make(chan struct{})
	fn := func(ctx context.Context) (ctrd.Image, error) {
		started.Add(1)
		select {
		case <-release:
			return nil, errors.New("done")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = rt.pulls.do(context.Background(), "img", fn)
		}()
	}
	waitWaiters(t, rt, "img", len(errs)) // every caller joined before the pull ends
	close(release)
	wg.Wait()
	if n := started.Load(); n != 1 {
		t.Fatalf("%d pulls for 5 callers, want 1", n)
	}
	for _, err := range errs {
		if err == nil || err.Error() != "done" {
			t.Fatalf("a caller got %v, want the shared result", err)
		}
	}
	// Every caller leaves: the pull is cancelled.
	cancelled := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := rt.pulls.do(ctx, "img2", func(pctx context.Context) (ctrd.Image, error) {
			<-pctx.Done()
			cancelled <- pctx.Err()
			return nil, pctx.Err()
		})
		_ = err
	}()
	waitWaiters(t, rt, "img2", 1)
	cancel()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("pull ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pull went on after its only caller left")
	}
}

// waitWaiters waits until n callers wait for the pull of name: a sleep
// instead may be too short on a busy machine.
func waitWaiters(t *testing.T, rt *Runtime, name string, n int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d callers wait for the pull of %s", n, name), func() bool {
		rt.pulls.mu.Lock()
		defer rt.pulls.mu.Unlock()
		c := rt.pulls.calls[name]
		return c != nil && c.waiters == n
	})
}

func TestLookupAuth(t *testing.T) {
	cfg := []byte(`{"auths": {
		"https://index.docker.io/v1/": {"auth": "` + base64.StdEncoding.EncodeToString([]byte("hub:pw")) + `"},
		"reg.example:5000": {"username": "u", "password": "p"},
		"tok.example": {"identitytoken": "T"}},
		"credHelpers": {"ecr.example": "ecr-login"}}`)
	for host, want := range map[string][3]string{
		"registry-1.docker.io": {"hub", "pw", ""},
		"reg.example:5000":     {"u", "p", ""},
		"tok.example":          {"", "T", ""},
		"ecr.example":          {"", "", "ecr-login"},
		"other.example":        {"", "", ""},
	} {
		u, p, h, err := lookupAuth(cfg, host)
		if err != nil || [3]string{u, p, h} != want {
			t.Errorf("%s: %q %q %q %v, want %v", host, u, p, h, err, want)
		}
	}
	if _, _, _, err := lookupAuth([]byte(`{"auths": {"x": {"auth": "!!"}}}`), "x"); err == nil {
		t.Error("a bad base64 auth was accepted")
	}
}

// A docker config.json that group or others may read is refused, as the
// manifest URL's header file is; a private one is read.
func TestCredentialsFileMode(t *testing.T) {
	path := authFile(t, "reg.example", "u", "p")
	rt := &Runtime{registry: RegistryConfig{AuthFiles: []string{path}}}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, _, err := rt.credentials("reg.example"); !errors.Is(err, ErrCredentialsMode) || !strings.Contains(err.Error(), path) {
			t.Errorf("mode %#o: %v; want ErrCredentialsMode naming %s", mode, err, path)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if u, p, err := rt.credentials("reg.example"); err != nil || u != "u" || p != "p" {
		t.Errorf("mode 0600: %q %q %v; want u p", u, p, err)
	}
}

// serveRegistry runs a plain docker-registry at addr with its storage in
// dir until the returned stop.
func serveRegistry(t *testing.T, addr, dir string) (stop func()) {
	t.Helper()
	return runRegistry(t, dir, fmt.Sprintf("version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: %s}\n", dir, addr), addr)
}

// runRegistry runs docker-registry with config (written into dir) until
// the returned stop or the test's end, once it accepts on addr.
func runRegistry(t *testing.T, dir, config, addr string) (stop func()) {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	prerequisite(t, err == nil, "docker-registry (apt-get install docker-registry)")
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfg)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(stop)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return stop
		}
	}
	t.Fatal("docker-registry did not start")
	return nil
}

// pushFrom pushes a busybox image (with extra marking its content) as name
// from a containerd namespace of its own, leaving rt's images alone.
func pushFrom(t *testing.T, rt *Runtime, name, extra string) string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "push-"+extra)
	img, err := ociimage.Busybox(name)
	if err != nil {
		t.Fatal(err)
	}
	img.Files["/version"] = ociimage.Regular([]byte(extra), 0o644)
	path := filepath.Join(t.TempDir(), "push.tar")
	if err := ociimage.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	if _, err := ImportArchive(ctx, rt.client, path, testSnapshotter); err != nil {
		t.Fatal(err)
	}
	ci, err := rt.client.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.client.Push(ctx, name, ci.Target()); err != nil {
		t.Fatal(err)
	}
	return ci.Target().Digest.String()
}

// After a fallback to the local copy, the image is pulled again in the
// background once the registry is back.
func TestFallbackRefreshesWhenTheRegistryIsBack(t *testing.T) {
	rt := testRuntime(t)
	rt.pullFallback = true
	rt.refresh.min, rt.refresh.max = 100*time.Millisecond, 200*time.Millisecond
	addr := freeAddr(t)
	name := addr + "/app:latest"
	stop := serveRegistry(t, addr, t.TempDir())
	old := pushFrom(t, rt, name, "v1")
	ctx := context.Background()
	if _, err := rt.EnsureImage(ctx, name, v1.PullAlways); err != nil {
		t.Fatal(err)
	}
	useImage(t, rt, name) // a pod's container: the refresh goes on
	stop()
	img, err := rt.EnsureImage(ctx, name, v1.PullAlways)
	if err != nil || img.PullFallback == "" {
		t.Fatalf("registry down: %+v %v; want the local copy with a fallback reason", img, err)
	}
	// The registry comes back with a new image under the same name.
	serveRegistry(t, addr, t.TempDir())
	fresh := pushFrom(t, rt, name, "v2")
	deadline := time.Now().Add(15 * time.Second)
	for {
		ci, err := rt.client.GetImage(rt.ctx(ctx), name)
		if err == nil && ci.Target().Digest.String() == fresh {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local image not refreshed (old %s, want %s): %v", old, fresh, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

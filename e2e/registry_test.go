package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/containerd/remotes/docker/config"
	"golang.org/x/crypto/bcrypt"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testenv"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// registry runs Debian's docker-registry on a loopback port; stop ends it.
type registry struct {
	addr string
	cmd  *exec.Cmd
}

func startRegistry(t *testing.T) *registry {
	t.Helper()
	dir := t.TempDir()
	return runRegistry(t, dir, "storage: {filesystem: {rootdirectory: %[1]s}}\nhttp: {addr: %[2]s}\n")
}

// runRegistry serves docker-registry with the given config body (%[1]s is
// its dir, %[2]s its address) on a free loopback port until the test ends.
func runRegistry(t *testing.T, dir, body string) *registry {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	testenv.Require(t, err == nil, "docker-registry (apt-get install docker-registry)")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	config := "version: 0.1\nlog: {level: warn}\n" + fmt.Sprintf(body, dir, addr)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &registry{addr: addr, cmd: exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return r
		}
	}
	t.Fatal("docker-registry did not start")
	return nil
}

func (r *registry) stop() {
	if r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// push puts a busybox image named name into the registry, through a
// containerd namespace of the test's own.
func (r *registry) push(t *testing.T, name string) {
	t.Helper()
	pushWith(t, name, "", "", "")
}

func (n *node) writeHostsToml(host, content string) {
	n.t.Helper()
	dir := filepath.Join(n.root, "certs.d", host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// mirrorDockerIO has docker.io pulled through reg, a plain-HTTP mirror.
func (n *node) mirrorDockerIO(reg *registry) {
	n.t.Helper()
	n.writeHostsToml("docker.io", fmt.Sprintf("server = \"https://registry-1.docker.io\"\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", reg.addr))
}

func imagePod(name, image, policy string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: %s
    command: ["sleep", "3600"]
`, name, image, policy)
}

// TestRegistryMirrorThenOfflineFallback: a hosts.toml mirror serves a
// docker.io image; once the registry is gone, an Always pod runs the local
// copy with a PullFallbackLocal warning.
func TestRegistryMirrorThenOfflineFallback(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	reg := startRegistry(t)
	reg.push(t, reg.addr+"/library/busybox:mirrored")
	n.mirrorDockerIO(reg)

	n.writeManifest("a.yaml", imagePod("a", "busybox:mirrored", "IfNotPresent"))
	n.waitPod("a", "running (pulled through the mirror)", running)
	evs := n.events("a")
	if !hasEvent(evs, "Pulling", `Pulling image "busybox:mirrored"`) || !hasEvent(evs, "Pulled", `Successfully pulled image "busybox:mirrored"`) {
		t.Errorf("events: %+v", evs)
	}

	reg.stop()
	n.writeManifest("b.yaml", imagePod("b", "busybox:mirrored", "Always"))
	n.waitPod("b", "running on the local copy", running)
	if !hasEvent(n.events("b"), "PullFallbackLocal", "registry unreachable, running the local copy of docker.io/library/busybox:mirrored") {
		t.Errorf("no PullFallbackLocal warning: %+v", n.events("b"))
	}
}

// TestRegistryFallbackNever: with --image-pull-fallback=never an Always
// pod whose registry cannot be reached backs off as under the kubelet,
// though the image is present.
func TestRegistryFallbackNever(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--image-pull-fallback", "never")
	n.writeManifest("strict.yaml", imagePod("strict", "busybox:1.36", "Always"))
	p := n.waitPod("strict", "ImagePullBackOff", func(p *v1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "ImagePullBackOff"
	})
	if p.Status.ContainerStatuses[0].State.Running != nil {
		t.Fatal("ran the local copy although fallback is off")
	}
	if !hasEvent(n.events("strict"), "Failed", `Failed to pull image "busybox:1.36"`) {
		t.Errorf("no Failed pull event: %+v", n.events("strict"))
	}
}

// startSecureRegistry runs docker-registry with TLS (a test CA, in dir) and
// htpasswd auth for user/pass.
func startSecureRegistry(t *testing.T, user, pass string) (*registry, []byte) {
	t.Helper()
	dir := t.TempDir()
	writeEtcdCerts(t, dir) // ca.crt, server.crt, server.key for 127.0.0.1
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runRegistry(t, dir, "storage: {filesystem: {rootdirectory: %[1]s/data}}\n"+
		"auth: {htpasswd: {realm: test, path: %[1]s/htpasswd}}\nhttp: {addr: %[2]s, tls: {certificate: %[1]s/server.crt, key: %[1]s/server.key}}\n")
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return r, ca
}

// pushWith pushes a busybox image as name through a resolver that reads
// hosts.toml files under certsDir (if any) and logs in as user.
func pushWith(t *testing.T, name, certsDir, user, pass string) {
	t.Helper()
	img, err := ociimage.Busybox(name)
	if err != nil {
		t.Fatal(err)
	}
	pushImage(t, img, certsDir, user, pass)
}

// pushImage pushes img (to the registry its name names) as pushWith does.
func pushImage(t *testing.T, img ociimage.Image, certsDir, user, pass string) {
	t.Helper()
	name := img.Name
	ctx := namespaces.WithNamespace(context.Background(), "e2e-push-"+nsSuffix(t.Name()))
	path := filepath.Join(t.TempDir(), "push.tar")
	if err := ociimage.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrdrt.ImportArchive(ctx, client, path, snapshotter); err != nil {
		t.Fatal(err)
	}
	ci, err := client.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	opts := config.HostOptions{Credentials: func(string) (string, string, error) { return user, pass, nil }}
	if certsDir != "" {
		opts.HostDir = config.HostDirFromRoot(certsDir)
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, opts)})
	if err := client.Push(ctx, name, ci.Target(), containerd.WithResolver(resolver)); err != nil {
		t.Fatalf("push %s: %v", name, err)
	}
	_ = client.ImageService().Delete(ctx, name)
}

func (n *node) writeAuth(host, user, pass string) {
	n.t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	if err := os.WriteFile(filepath.Join(n.state, "config.json"), []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth)), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

// TestRegistryTLSAuthAndStall: a registry with TLS from a test CA (named in
// its hosts.toml) and htpasswd auth is pulled from with the credentials of
// noderun's config.json; a wrong password is an ErrImagePull saying
// unauthorized; a registry that accepts and never answers is given up on
// after --image-pull-progress-timeout, naming it.
func TestRegistryTLSAuthAndStall(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--image-pull-progress-timeout", "2s")
	reg, ca := startSecureRegistry(t, "noderun", "s3cret")
	certs := filepath.Join(n.root, "certs.d")
	n.writeHostsToml(reg.addr, fmt.Sprintf("server = \"https://%[1]s\"\n[host.\"https://%[1]s\"]\n  ca = \"ca.crt\"\n", reg.addr))
	if err := os.WriteFile(filepath.Join(certs, reg.addr, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	pushWith(t, reg.addr+"/app:1", certs, "noderun", "s3cret")

	n.writeAuth(reg.addr, "noderun", "wrong")
	n.writeManifest("denied.yaml", imagePod("denied", reg.addr+"/app:1", "IfNotPresent"))
	p := n.waitPod("denied", "refused by the registry", func(p *v1.Pod) bool {
		r, _ := waitingReason(p, "main")
		return r == "ErrImagePull" || r == "ImagePullBackOff"
	})
	if !hasEvent(n.events("denied"), "Failed", `Failed to pull image "`+reg.addr+`/app:1"`) {
		t.Errorf("events: %+v", n.events("denied"))
	}
	if _, msg := waitingReason(p, "main"); msg != "" && !strings.Contains(strings.ToLower(msg), "unauthorized") && !strings.Contains(msg, "Back-off") {
		t.Errorf("wrong password: %q, want it to say unauthorized", msg)
	}
	found := false
	for _, ev := range n.events("denied") {
		found = found || (ev.Reason == "Failed" && strings.Contains(strings.ToLower(ev.Message), "unauthorized") && strings.Contains(ev.Message, reg.addr))
	}
	if !found {
		t.Errorf("no Failed event naming %s and unauthorized: %+v", reg.addr, n.events("denied"))
	}

	n.writeAuth(reg.addr, "noderun", "s3cret")
	n.writeManifest("authed.yaml", imagePod("authed", reg.addr+"/app:1", "IfNotPresent"))
	n.waitPodFor("authed", "running with the right password", 40*time.Second, running)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	stalled := l.Addr().String() + "/stuck:1"
	n.writeManifest("stuck.yaml", imagePod("stuck", stalled, "IfNotPresent"))
	n.waitPodFor("stuck", "given up on", 30*time.Second, func(p *v1.Pod) bool {
		r, msg := waitingReason(p, "main")
		return r == "ErrImagePull" && strings.Contains(msg, "no progress from "+l.Addr().String())
	})
}

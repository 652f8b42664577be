package containerd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/containerd/remotes/docker/config"
	remoteerrors "github.com/containerd/containerd/remotes/errors"
	"github.com/containerd/errdefs"

	"github.com/noderun/noderun/internal/secretfile"
	"github.com/noderun/noderun/runner"
)

// RegistryConfig says how pulls reach registries, the way containerd's CRI
// plugin does: per-registry hosts.toml files under ConfigDir (its
// config_path), credentials from a docker config.json.
type RegistryConfig struct {
	// ConfigDir holds <host>/hosts.toml (mirrors, capabilities, ca,
	// client certificates, skip_verify, override_path); read at every
	// pull, so edits apply to the next one.
	ConfigDir string
	// AuthFiles are docker config.json candidates; the first that exists
	// is read at every pull.
	AuthFiles []string
	// ProgressTimeout cancels a pull that received nothing for this long
	// (0: never).
	ProgressTimeout time.Duration
}

// WithRegistry sets how pulls reach registries.
func WithRegistry(cfg RegistryConfig) Option { return func(r *Runtime) { r.registry = cfg } }

// resolver is a pull's view of the registries. Every response body it
// reads counts as progress for the pull's watchdog.
func (r *Runtime) resolver(ctx context.Context, progress *progress) remotes.Resolver {
	hosts := config.ConfigureHosts(ctx, config.HostOptions{
		HostDir:     hostDir(r.registry.ConfigDir),
		Credentials: r.credentials,
		UpdateClient: func(c *http.Client) error {
			c.Transport = progressTransport{next: c.Transport, p: progress}
			return nil
		},
	})
	return docker.NewResolver(docker.ResolverOptions{Hosts: hosts})
}

func hostDir(root string) func(string) (string, error) {
	if root == "" {
		return nil
	}
	return config.HostDirFromRoot(root)
}

// ErrCredentialsMode is why a docker config.json that group or others may
// access is refused, as the manifest URL's header file is: it holds
// registry secrets.
var ErrCredentialsMode = secretfile.ErrMode

// credentials answers a registry host from the first docker config.json
// found. Credential helpers (credsStore, credHelpers) are not run: they
// are programs, and a node that starts one per pull surprises; a host that
// names one gets anonymous access and a warning.
func (r *Runtime) credentials(host string) (string, string, error) {
	for _, path := range r.registry.AuthFiles {
		b, err := readPrivate(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("registry credentials %s: %w", path, err)
		}
		user, secret, helper, err := lookupAuth(b, host)
		if err != nil {
			return "", "", fmt.Errorf("registry credentials %s: %w", path, err)
		}
		if helper != "" {
			r.log.Warn("registry credentials: credential helpers are not run; pulling anonymously", "file", path, "host", host, "helper", helper)
		}
		return user, secret, nil
	}
	return "", "", nil
}

// readPrivate reads a file only group and others cannot access.
func readPrivate(path string) ([]byte, error) {
	f, err := secretfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// dockerConfig is the part of a docker config.json credentials live in.
type dockerConfig struct {
	Auths map[string]struct {
		Auth          string `json:"auth"`
		Username      string `json:"username"`
		Password      string `json:"password"`
		IdentityToken string `json:"identitytoken"`
	} `json:"auths"`
	CredsStore  string            `json:"credsStore"`
	CredHelpers map[string]string `json:"credHelpers"`
}

// lookupAuth finds host's credentials. Keys may be a bare host or a URL;
// Docker Hub is stored under https://index.docker.io/v1/.
func lookupAuth(b []byte, host string) (user, secret, helper string, err error) {
	var cfg dockerConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return "", "", "", err
	}
	want := []string{host}
	if host == "registry-1.docker.io" || host == "docker.io" || host == "index.docker.io" {
		want = append(want, "https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")
	}
	for key, a := range cfg.Auths {
		k := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://"), "/")
		k, _, _ = strings.Cut(k, "/")
		if !matchesAny(key, k, want) {
			continue
		}
		if a.IdentityToken != "" {
			return "", a.IdentityToken, "", nil
		}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return "", "", "", fmt.Errorf("auths[%q].auth: %w", key, err)
			}
			u, p, ok := strings.Cut(string(dec), ":")
			if !ok {
				return "", "", "", fmt.Errorf("auths[%q].auth: not user:password", key)
			}
			return u, p, "", nil
		}
		return a.Username, a.Password, "", nil
	}
	if h := cfg.CredHelpers[host]; h != "" {
		return "", "", h, nil
	}
	return "", "", cfg.CredsStore, nil
}

func matchesAny(key, bare string, want []string) bool {
	for _, w := range want {
		if key == w || bare == w {
			return true
		}
	}
	return false
}

// progress is a pull's watchdog: it cancels the pull when no response
// bytes arrived for the timeout, naming the host it last waited on. It
// also keeps the last answer by which a registry said it cannot serve now.
type progress struct {
	mu          sync.Mutex
	last        time.Time
	host        string
	unavailable string // "host: status" of the last such answer
}

func (p *progress) answered(host string, resp *http.Response) {
	if unavailableStatus(resp.StatusCode) {
		p.mu.Lock()
		p.unavailable = host + " answered " + resp.Status
		p.mu.Unlock()
	}
}

// cannotServe wraps a failed pull's err with errRegistryUnavailable when a
// registry answered that it cannot serve now and err is not a refusal
// containerd reports with its status (which unreachable reads itself).
func (p *progress) cannotServe(err error) error {
	p.mu.Lock()
	u := p.unavailable
	p.mu.Unlock()
	var status remoteerrors.ErrUnexpectedStatus
	if u == "" || errors.As(err, &status) || errdefs.IsNotFound(err) {
		return err
	}
	return fmt.Errorf("%w (%w: %s)", err, errRegistryUnavailable, u)
}

func (p *progress) touch(host string) {
	p.mu.Lock()
	p.last, p.host = time.Now(), host
	p.mu.Unlock()
}

// watch cancels with a cause once nothing moved for timeout; it returns
// when ctx ends.
func (p *progress) watch(ctx context.Context, cancel context.CancelCauseFunc, timeout time.Duration) {
	tick := time.NewTicker(min(timeout/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.mu.Lock()
			idle, host := time.Since(p.last), p.host
			p.mu.Unlock()
			if idle >= timeout {
				cancel(fmt.Errorf("%w: no progress from %s for %s", errPullStalled, host, timeout.Round(time.Second)))
				return
			}
		}
	}
}

// errPullStalled is the cause of a pull cancelled by its watchdog.
var errPullStalled = errors.New("pull stalled")

// progressTransport counts a request sent, and every body read, as
// progress.
type progressTransport struct {
	next http.RoundTripper
	p    *progress
}

func (t progressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.p == nil { // a push
		return t.next.RoundTrip(req)
	}
	t.p.touch(req.URL.Host)
	resp, err := t.next.RoundTrip(req)
	if err == nil {
		t.p.touch(req.URL.Host)
		t.p.answered(req.URL.Host, resp)
		resp.Body = progressBody{ReadCloser: resp.Body, p: t.p, host: req.URL.Host}
	}
	return resp, err
}

type progressBody struct {
	io.ReadCloser
	p    *progress
	host string
}

func (b progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.p.touch(b.host)
	}
	return n, err
}

// pull pulls name through the configured registries. Concurrent pulls of
// one image are one pull; it is cancelled when every caller has gone (the
// pods that wanted it were removed) or when it stalls.
func (r *Runtime) pull(ctx context.Context, name string) (ctrd.Image, error) {
	runner.PullStarted(ctx, name)
	return r.pulls.do(ctx, name, func(pctx context.Context) (ctrd.Image, error) {
		prog := &progress{last: time.Now()}
		if t := r.registry.ProgressTimeout; t > 0 {
			wctx, cancel := context.WithCancelCause(pctx)
			defer cancel(nil)
			go prog.watch(wctx, cancel, t)
			pctx = wctx
		}
		img, err := pull(pctx, r.client, name, r.snapshotter, ctrd.WithResolver(r.resolver(pctx, prog)))
		if cause := context.Cause(pctx); err != nil && errors.Is(cause, errPullStalled) {
			return nil, fmt.Errorf("%w: %s: %w", ErrImagePull, name, cause)
		}
		if err != nil {
			return nil, prog.cannotServe(err)
		}
		return img, nil
	})
}

// pullGroup joins concurrent pulls of one image.
type pullGroup struct {
	mu    sync.Mutex
	calls map[string]*pullCall
}

type pullCall struct {
	done    chan struct{}
	img     ctrd.Image
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do runs fn once for name while callers wait; a caller whose ctx ends
// stops waiting, and the last one to leave cancels fn.
func (g *pullGroup) do(ctx context.Context, name string, fn func(context.Context) (ctrd.Image, error)) (ctrd.Image, error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = map[string]*pullCall{}
	}
	c := g.calls[name]
	if c == nil {
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &pullCall{done: make(chan struct{}), cancel: cancel}
		g.calls[name] = c
		go func() {
			c.img, c.err = fn(pctx)
			cancel()
			g.mu.Lock()
			delete(g.calls, name)
			g.mu.Unlock()
			close(c.done)
		}()
	}
	c.waiters++
	g.mu.Unlock()
	select {
	case <-c.done:
		return c.img, c.err
	case <-ctx.Done():
		g.mu.Lock()
		c.waiters--
		if c.waiters == 0 {
			c.cancel()
		}
		g.mu.Unlock()
		return nil, ctx.Err()
	}
}

// refresher keeps pulling images that were run from their local copy
// because the registry could not be reached, so the node has the current
// image once the registry is back (for the next start; running containers
// keep theirs, as with any Always pull).
type refresher struct {
	mu       sync.Mutex
	pending  map[string]bool
	min, max time.Duration // backoff between attempts; 0: 10 s to 5 min
}

// refreshLater starts refreshing name unless that is under way; it keeps
// trying at the backoff rate until a pull succeeds (a registry that
// answers "not found" may be in the middle of a push), or until no
// container is made from the image any more: its pods are gone, and a pod
// that comes for it pulls it anyway.
func (r *Runtime) refreshLater(name string) {
	f := &r.refresh
	f.mu.Lock()
	if f.pending == nil {
		f.pending = map[string]bool{}
	}
	if f.pending[name] {
		f.mu.Unlock()
		return
	}
	f.pending[name] = true
	wait, most := f.min, f.max
	f.mu.Unlock()
	if wait == 0 {
		wait, most = 10*time.Second, 5*time.Minute
	}
	go func() {
		defer func() {
			f.mu.Lock()
			delete(f.pending, name)
			f.mu.Unlock()
		}()
		logged := false
		for {
			time.Sleep(wait)
			if used, err := r.imageInUse(name); err == nil && !used {
				r.log.Info("image refresh stopped: no container uses the image any more", "image", name)
				return
			}
			_, err := r.pull(context.Background(), name)
			if err == nil {
				r.log.Info("registry reachable again; image refreshed", "image", name)
				return
			}
			if !unreachable(err) && !logged {
				r.log.Warn("image refresh: the registry answered but refused; still trying", "image", name, "err", err)
				logged = true
			}
			wait = min(wait*2, most)
		}
	}()
}

// imageInUse reports whether a container of noderun's is made from the
// image name.
func (r *Runtime) imageInUse(name string) (bool, error) {
	ctx, cancel := context.WithTimeout(r.ctx(context.Background()), time.Minute)
	defer cancel()
	cs, err := r.client.ContainerService().List(ctx, "image=="+strconv.Quote(name))
	return len(cs) > 0, err
}

package containerd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	remoteerrors "github.com/containerd/containerd/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/dirpoll"
	"github.com/noderun/noderun/runner"
)

// Image errors are the runner's, whose waiting reasons they name.
var (
	ErrImagePull        = runner.ErrImagePull
	ErrImageNeverPull   = runner.ErrImageNeverPull
	ErrInvalidImageName = runner.ErrInvalidImageName
)

// settleDelay is how long a tarball in the images dir must go without
// writes before it is imported.
const settleDelay = 500 * time.Millisecond

// ImportArchive imports an OCI layout or docker-archive tarball, unpacks
// every named image into snapshotter and returns the image names.
func ImportArchive(ctx context.Context, c *ctrd.Client, path, snapshotter string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	err = withLease(ctx, c, leaseImport, func(ctx context.Context) error {
		imgs, err := c.Import(ctx, f)
		if err != nil {
			return fmt.Errorf("import %s: %w", path, err)
		}
		if len(imgs) == 0 {
			return fmt.Errorf("import %s: archive names no image", path)
		}
		for _, img := range imgs {
			if err := ctrd.NewImage(c, img).Unpack(ctx, snapshotter); err != nil {
				return fmt.Errorf("unpack %s from %s: %w", img.Name, path, err)
			}
			names = append(names, img.Name)
		}
		return nil
	})
	return names, err
}

// ImportDir imports every *.tar in dir in name order, skipping dot-files
// (tarballs still being written) and, with a ledger, tarballs imported
// before and unchanged since. A bad tarball is logged and skipped.
func ImportDir(ctx context.Context, c *ctrd.Client, dir, snapshotter string, ledger *ImportLedger, log *slog.Logger) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if ctx.Err() != nil {
			return names, ctx.Err()
		}
		if e.Type().IsRegular() && isArchiveName(e.Name()) {
			names = append(names, importLogged(ctx, c, filepath.Join(dir, e.Name()), snapshotter, ledger, log)...)
		}
	}
	return names, nil
}

func isArchiveName(name string) bool {
	return strings.HasSuffix(name, ".tar") && !strings.HasPrefix(name, ".")
}

func importLogged(ctx context.Context, c *ctrd.Client, path, snapshotter string, ledger *ImportLedger, log *slog.Logger) []string {
	fi, statErr := os.Stat(path)
	if statErr == nil {
		if names, ok := ledger.unchanged(ctx, c, path, fi); ok {
			log.Debug("image tarball unchanged since its import", "path", path, "images", names)
			return names
		}
	}
	names, err := ImportArchive(ctx, c, path, snapshotter)
	if err != nil {
		log.Warn("image import failed", "path", path, "err", err)
		return names
	}
	log.Info("imported images", "path", path, "images", names)
	if statErr == nil {
		if err := ledger.record(path, fi, names); err != nil {
			log.Warn("image import ledger", "err", err)
		}
	}
	return names
}

// WatchImagesDir returns at once: tarballs the ledger knows unchanged need
// nothing; the returned watch imports the others first, then each *.tar
// that is created, written or renamed into dir once it has settled, until
// ctx ends (it then returns nil). Until the first imports are done the
// ledger says so (busy), so a missing image waits for them instead of
// being pulled. Importing is idempotent.
func WatchImagesDir(ctx context.Context, c *ctrd.Client, dir, snapshotter string, ledger *ImportLedger, log *slog.Logger) (watch func() error, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Watch before the first scan so nothing lands unseen in between.
	events, errs, closeWatch := watchOrPoll(ctx, dir, log)
	entries, err := os.ReadDir(dir)
	if err != nil {
		closeWatch()
		return nil, err
	}
	var changed []string
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() || !isArchiveName(e.Name()) {
			continue
		}
		if fi, err := e.Info(); err == nil {
			if _, ok := ledger.unchanged(ctx, c, path, fi); ok {
				continue
			}
		}
		changed = append(changed, path)
	}
	done := ledger.startImports()
	return func() error {
		defer closeWatch()
		for _, path := range changed {
			if ctx.Err() != nil {
				break
			}
			importLogged(ctx, c, path, snapshotter, ledger, log)
		}
		done()
		return watchLoop(ctx, events, errs, func(path string) { importLogged(ctx, c, path, snapshotter, ledger, log) }, log)
	}, nil
}

// ImportImagesDir imports the tarballs present now, then keeps watching the
// directory for new ones.
func ImportImagesDir(ctx context.Context, c *ctrd.Client, dir, snapshotter string, ledger *ImportLedger, log *slog.Logger) error {
	watch, err := WatchImagesDir(ctx, c, dir, snapshotter, ledger, log)
	if err != nil {
		return err
	}
	go func() {
		if err := watch(); err != nil {
			log.Error("images dir watch stopped", "dir", dir, "err", err)
		}
	}()
	return nil
}

// pollImagesEvery is how often the images dir is looked at while it cannot
// be watched.
const pollImagesEvery = 5 * time.Second

// newImagesWatcher is fsnotify's; tests make it fail.
var newImagesWatcher = fsnotify.NewWatcher

// watchOrPoll watches dir, or when the host has no inotify instance or
// watch left, says so and polls it.
func watchOrPoll(ctx context.Context, dir string, log *slog.Logger) (<-chan fsnotify.Event, <-chan error, func()) {
	w, err := newImagesWatcher()
	if err == nil {
		if err = w.Add(dir); err == nil {
			return w.Events, w.Errors, func() { w.Close() }
		}
		w.Close()
	}
	log.Warn("cannot watch the images dir; looking at it every "+pollImagesEvery.String(), "dir", dir, "err", err)
	ctx, cancel := context.WithCancel(ctx)
	return dirpoll.Events(ctx, pollImagesEvery, dir), nil, cancel
}

// watchLoop calls settled for each archive path once settleDelay has passed
// since its last create or write event.
func watchLoop(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error, settled func(path string), log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx) // also releases pending timers on return
	defer cancel()
	ready := make(chan string)
	timers := map[string]*time.Timer{}
	defer func() {
		for _, t := range timers {
			t.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case path := <-ready:
			delete(timers, path)
			settled(path)
		case err, ok := <-errs:
			if !ok {
				return errors.New("images dir watcher closed")
			}
			log.Warn("images dir watch", "err", err)
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return nil // a poll ends with ctx
				}
				return errors.New("images dir watcher closed")
			}
			if !isArchiveName(filepath.Base(ev.Name)) || !ev.Has(fsnotify.Create|fsnotify.Write) {
				continue
			}
			if t, ok := timers[ev.Name]; ok {
				t.Reset(settleDelay)
				continue
			}
			timers[ev.Name] = time.AfterFunc(settleDelay, func() {
				select {
				case ready <- ev.Name:
				case <-ctx.Done():
				}
			})
		}
	}
}

// EnsureImage returns the image for ref after applying the Kubernetes pull
// policy; ref is normalized as Kubernetes does ("busybox" is
// "docker.io/library/busybox:latest"). The image is unpacked into
// snapshotter.
//
// Always means pull, and a failed pull fails even when the image is
// present, as in Kubernetes; the Runtime may fall back to the local copy
// when the registry cannot be reached at all (WithPullFallback).
func EnsureImage(ctx context.Context, c *ctrd.Client, ref string, policy v1.PullPolicy, snapshotter string) (ctrd.Image, error) {
	pullFn := func(ctx context.Context, name string) (ctrd.Image, error) { return pull(ctx, c, name, snapshotter) }
	img, pulled, _, err := resolveImage(ctx, c, ref, policy, fallbackNever, pullFn)
	if err != nil || pulled {
		return img, err
	}
	return img, ensureUnpacked(ctx, c, img, snapshotter)
}

// resolveImage finds or pulls the image per policy; pulled images are
// unpacked already, found ones may not be. With fallback, an Always pull
// that could not reach the registry (not one the registry refused) uses
// the local copy if there is one, and says why in fellBack.
func resolveImage(ctx context.Context, c *ctrd.Client, ref string, policy v1.PullPolicy, fallback bool, pull puller) (img ctrd.Image, pulled bool, fellBack error, err error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return nil, false, nil, fmt.Errorf("%w: %q: %w", ErrInvalidImageName, ref, err)
	}
	name := named.String()
	switch policy {
	case v1.PullAlways:
		img, err := pull(ctx, name)
		if err != nil && fallback && unreachable(err) && ctx.Err() == nil {
			if local, gerr := c.GetImage(ctx, name); gerr == nil {
				return local, false, err, nil
			}
		}
		return img, true, nil, err
	case v1.PullNever, v1.PullIfNotPresent, "":
	default:
		return nil, false, nil, fmt.Errorf("image %s: unknown pull policy %q", name, policy)
	}
	img, err = c.GetImage(ctx, name)
	switch {
	case err == nil:
		return img, false, nil, nil
	case !errdefs.IsNotFound(err):
		return nil, false, nil, fmt.Errorf("image %s: %w", name, err)
	case policy == v1.PullNever:
		return nil, false, nil, fmt.Errorf("%w: image %s is not present and the pull policy is Never", ErrImageNeverPull, name)
	}
	img, err = pull(ctx, name)
	return img, true, nil, err
}

// puller pulls and unpacks one image.
type puller func(ctx context.Context, name string) (ctrd.Image, error)

const fallbackNever = false

// unreachable tells a registry the image could not be got from (no DNS
// answer, connection refused or unroutable, a timeout or a stalled pull, a
// TLS handshake or certificate that failed, as behind a captive portal or
// an intercepting proxy, or an answer that it cannot serve now: 5xx, 429,
// 408) from one that answered and refused (401, 403, 404): only the first
// may fall back to a local copy.
func unreachable(err error) bool {
	var status remoteerrors.ErrUnexpectedStatus
	if errors.As(err, &status) {
		return unavailableStatus(status.StatusCode)
	}
	if errdefs.IsNotFound(err) {
		return false
	}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var netErr net.Error
	var verifyErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	var alert tls.AlertError
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var badCert x509.CertificateInvalidError
	return errors.As(err, &dnsErr) ||
		(errors.As(err, &opErr) && opErr.Op == "dial") ||
		(errors.As(err, &netErr) && netErr.Timeout()) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, errPullStalled) || errors.Is(err, errRegistryUnavailable) ||
		errors.As(err, &verifyErr) || errors.As(err, &recordErr) || errors.As(err, &alert) ||
		errors.As(err, &unknownCA) || errors.As(err, &badHost) || errors.As(err, &badCert) ||
		errors.Is(err, http.ErrSchemeMismatch)
}

// unavailableStatus is an HTTP status by which a registry says it cannot
// serve now, rather than that it refuses.
func unavailableStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
}

// errRegistryUnavailable marks a pull that failed after the registry
// answered with an unavailableStatus: containerd's blob fetcher reports
// that status only as text.
var errRegistryUnavailable = errors.New("the registry cannot serve now")

func pull(ctx context.Context, c *ctrd.Client, name, snapshotter string, opts ...ctrd.RemoteOpt) (ctrd.Image, error) {
	var img ctrd.Image
	err := withLease(ctx, c, leasePull, func(ctx context.Context) (err error) {
		img, err = c.Pull(ctx, name, append([]ctrd.RemoteOpt{ctrd.WithPullUnpack, ctrd.WithPullSnapshotter(snapshotter)}, opts...)...)
		return err
	})
	if err == nil {
		return img, nil
	}
	if _, gerr := c.GetImage(ctx, name); gerr == nil {
		return nil, fmt.Errorf("%w: %s (a local copy exists; imagePullPolicy IfNotPresent would use it): %w", ErrImagePull, name, err)
	}
	return nil, fmt.Errorf("%w: %s: %w", ErrImagePull, name, err)
}

func ensureUnpacked(ctx context.Context, c *ctrd.Client, img ctrd.Image, snapshotter string) error {
	unpacked, err := img.IsUnpacked(ctx, snapshotter)
	if err == nil && !unpacked {
		err = withLease(ctx, c, leasePull, func(ctx context.Context) error { return img.Unpack(ctx, snapshotter) })
	}
	if err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name(), err)
	}
	return nil
}

// ImageConfigOf returns the parts of img's OCI config that Kubernetes merges
// with a container spec.
func ImageConfigOf(ctx context.Context, img ctrd.Image) (runner.ImageConfig, error) {
	spec, err := img.Spec(ctx)
	if err != nil {
		return runner.ImageConfig{}, fmt.Errorf("image %s config: %w", img.Name(), err)
	}
	cfg := spec.Config
	return runner.ImageConfig{
		Ref:        img.Name(),
		Entrypoint: cfg.Entrypoint,
		Cmd:        cfg.Cmd,
		Env:        cfg.Env,
		WorkingDir: cfg.WorkingDir,
		User:       cfg.User,
		StopSignal: cfg.StopSignal,
	}, nil
}

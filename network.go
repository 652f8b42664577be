package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/dirpoll"
	"github.com/noderun/noderun/runner"
)

// network adapts the cni leaf to runner.Network. It remembers a pod's IPs in
// its sandbox dir (on the run-dir tmpfs), so a restarted noderun finds a live
// sandbox without calling CNI again, while after a reboot the dir is gone and
// the stale allocation is released before the pod is attached anew.
//
// It also watches the host's links: when a pod's veth (or the bridge) is
// deleted, the pod is marked suspect and its worker poked, and its next
// Check asks the plugins, so the sandbox is repaired at once.
type network struct {
	cni     *cni.Manager
	podsDir string      // <run-dir>/pods, where sandbox dirs live
	holder  *cni.Holder // pods' ipc and uts namespaces (nil: in their sandbox dirs)
	cfgDirs []string    // CNI conf and bin dirs: a change there may make the network ready
	log     *slog.Logger
	changed func(sandboxID string) // pokes the pod's worker

	mu      sync.Mutex
	ifaces  map[string]map[string]bool // host interface -> sandbox IDs using it
	suspect map[string]bool            // sandbox IDs whose interface vanished
	broken  map[string]bool            // sandbox IDs a check found broken
}

var _ runner.Network = (*network)(nil)

const ipsFile = "ips.json"

func newNetwork(m *cni.Manager, podsDir string, holder *cni.Holder, cfgDirs []string, log *slog.Logger) *network {
	return &network{cni: m, podsDir: podsDir, holder: holder, cfgDirs: cfgDirs, log: log,
		ifaces: map[string]map[string]bool{}, suspect: map[string]bool{}, broken: map[string]bool{}}
}

// watch reports deleted host interfaces to the pods using them, and changes
// to the CNI config or plugins to every pod, until ctx ends.
func (n *network) watch(ctx context.Context) {
	go n.watchConfig(ctx)
	err := cni.WatchLinkDeletions(ctx, func(name string) {
		n.mu.Lock()
		ids := n.ifaces[name]
		for id := range ids {
			n.suspect[id] = true
		}
		n.mu.Unlock()
		for id := range ids {
			n.log.Warn("a pod's host interface was deleted", "interface", name, "sandbox", id)
			n.changed(id)
		}
	})
	if err != nil {
		n.log.Error("watching host interfaces stopped; deleted veths are found by the periodic check only", "err", err)
	}
}

// watchConfig pokes every pod (those waiting for a usable network retry at
// once) when a CNI conf or bin dir changes.
func (n *network) watchConfig(ctx context.Context) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		// No inotify instance left on the host: look every few seconds.
		n.log.Warn("cannot watch the CNI config; looking at it every 5s", "err", err)
		for range dirpoll.Events(ctx, 5*time.Second, n.cfgDirs...) {
			n.changed("")
		}
		return
	}
	defer w.Close()
	for _, d := range n.cfgDirs {
		if err := w.Add(d); err != nil {
			n.log.Debug("not watching", "dir", d, "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.Events:
			n.changed("")
		case err := <-w.Errors:
			n.log.Warn("CNI config watch", "err", err)
		}
	}
}

// Setup makes the pod's namespaces, its network, its /dev/shm and, for
// shareProcessNamespace, the process that holds its PID namespace.
func (n *network) Setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
	ips, fresh, err := n.setup(ctx, sb)
	if err == nil && !sb.HostIPC {
		err = setupShm(sb)
	}
	if err == nil && sb.SharePID {
		err = ensurePause(sb)
	}
	return ips, fresh, err
}

// Pin makes the namespaces and /dev/shm that Setup would, before the
// network is attached.
func (n *network) Pin(_ context.Context, sb *runner.Sandbox) error {
	t0 := time.Now()
	if _, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, sb.HostNetwork, n.holder); err != nil {
		return err
	}
	n.log.Debug("pod namespaces pinned", "sandbox", sb.ID, "took", time.Since(t0))
	if sb.HostIPC {
		return nil
	}
	return setupShm(sb)
}

func (n *network) setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
	if !sb.HostNetwork && isNamespace(sb.NetNSPath()) {
		if ips, err := readIPs(sb.Dir); err == nil {
			// Repairs ipc/uts if only those went missing.
			_, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, false, n.holder)
			n.track(sb)
			return ips, false, err
		}
	}
	if sb.HostNetwork {
		fresh := !isNamespace(sb.IPCNSPath())
		_, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, true, n.holder)
		return nil, fresh, err
	}
	att, err := attachment(sb)
	if err != nil {
		return nil, false, err
	}
	if err := n.cni.Ready(); err != nil {
		return nil, false, notReady(err)
	}
	t0 := time.Now()
	if _, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, false, n.holder); err != nil {
		return nil, false, err
	}
	t1 := time.Now()
	// A fresh netns but an attachment left from an earlier boot or a crash
	// mid-ADD: release it first so its IP does not leak.
	if n.cni.Attached(att) {
		n.untrack(sb.ID)
		if err := n.cni.Del(ctx, withoutNetNS(att)); err != nil {
			n.log.Warn("releasing a stale pod network failed", "pod", sb.Namespace+"/"+sb.PodName, "err", err)
		}
	}
	ips, err := n.cni.Add(ctx, att)
	if err != nil {
		return nil, false, notReady(err)
	}
	n.log.Debug("pod network set up", "sandbox", sb.ID, "namespaces", t1.Sub(t0), "cni", time.Since(t1))
	n.track(sb)
	b, _ := json.Marshal(ips) // a []string always marshals
	return ips, true, os.WriteFile(filepath.Join(sb.Dir, ipsFile), b, 0o600)
}

func notReady(err error) error {
	if errors.Is(err, cni.ErrNetworkNotReady) {
		return fmt.Errorf("%w: %w", runner.ErrNetworkNotReady, err)
	}
	return err
}

func (n *network) Teardown(ctx context.Context, sb *runner.Sandbox) error {
	n.mu.Lock()
	broken := n.broken[sb.ID]
	delete(n.broken, sb.ID)
	n.mu.Unlock()
	n.untrack(sb.ID) // our own DEL removes the veth: not a breakage
	var errs []error
	if !sb.HostNetwork {
		att, _ := attachment(sb) // DEL needs no bandwidth: a bad annotation is no reason to leak
		if broken {
			// Its interface is gone, so the plugins cannot find what it
			// held through the netns: released by ID instead.
			att = withoutNetNS(att)
		}
		errs = append(errs, n.cni.Del(ctx, att))
	}
	if err := os.Remove(filepath.Join(sb.Dir, ipsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, stopPause(sb), unmountShm(sb), cni.RemoveNamespaces(sb.Dir, n.holder))
	return errors.Join(errs...)
}

// Check finds a sandbox whose pinned netns vanished; deeply, or when one of
// its host interfaces was deleted, it asks the plugins (CNI CHECK).
func (n *network) Check(ctx context.Context, sb *runner.Sandbox, deep bool) error {
	if !isNamespace(sb.NetNSPath()) {
		return fmt.Errorf("%w: %s is not a network namespace", runner.ErrSandboxBroken, sb.NetNSPath())
	}
	n.mu.Lock()
	suspect := n.suspect[sb.ID]
	delete(n.suspect, sb.ID)
	n.mu.Unlock()
	if !deep && !suspect {
		return nil
	}
	att, _ := attachment(sb)
	err := n.cni.Check(ctx, att)
	if errors.Is(err, cni.ErrCheckFailed) {
		n.mu.Lock()
		n.broken[sb.ID] = true
		n.mu.Unlock()
		return fmt.Errorf("%w: %w", runner.ErrSandboxBroken, err)
	}
	return err
}

// GC releases CNI leftovers and removes pinned namespaces of sandboxes
// noderun no longer knows.
func (n *network) GC(ctx context.Context, keep map[string]bool) error {
	released, err := n.cni.GC(ctx, keep)
	if len(released) > 0 {
		n.log.Info("released leftover pod networks", "sandboxes", released)
	}
	errs := []error{err}
	ents, err := os.ReadDir(n.podsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	removed := map[string]bool{}
	for _, d := range ents {
		if d.IsDir() && !keep[d.Name()] {
			dir := filepath.Join(n.podsDir, d.Name())
			n.log.Info("removing leftover pod sandbox", "dir", dir)
			for _, f := range append([]string{ipsFile}, runner.SandboxFiles...) {
				if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			sb := &runner.Sandbox{Dir: dir}
			errs = append(errs, runner.RemovePodFiles(dir), stopPause(sb), unmountShm(sb), cni.RemoveNamespaces(dir, n.holder))
			removed[d.Name()] = true
		}
	}
	if n.holder == nil {
		return errors.Join(errs...)
	}
	// Namespaces whose sandbox dir is gone (a crash while it was removed).
	ids, err := n.holder.IDs()
	errs = append(errs, err)
	for _, id := range ids {
		if !keep[id] && !removed[id] {
			n.log.Info("removing leftover pod namespaces", "sandbox", id)
			errs = append(errs, cni.RemoveNamespaces(filepath.Join(n.podsDir, id), n.holder))
		}
	}
	return errors.Join(errs...)
}

// track remembers which host interfaces the sandbox uses.
func (n *network) track(sb *runner.Sandbox) {
	att, _ := attachment(sb)
	names := n.cni.HostInterfaces(att)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		if n.ifaces[name] == nil {
			n.ifaces[name] = map[string]bool{}
		}
		n.ifaces[name][sb.ID] = true
	}
}

func (n *network) untrack(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, ids := range n.ifaces {
		delete(ids, id)
		if len(ids) == 0 {
			delete(n.ifaces, name)
		}
	}
	delete(n.suspect, id)
	delete(n.broken, id)
}

// attachment describes the sandbox to CNI. The error is about the bandwidth
// annotations, which only ADD needs.
func attachment(sb *runner.Sandbox) (cni.Attachment, error) {
	a := cni.Attachment{
		ID: sb.ID, NetNS: sb.NetNSPath(),
		PodNamespace: sb.Namespace, PodName: sb.PodName, PodUID: sb.PodUID,
	}
	for _, p := range sb.Ports {
		a.PortMappings = append(a.PortMappings, cni.PortMapping{
			HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol, HostIP: p.HostIP})
	}
	if d := sb.DNS; len(d.Servers)+len(d.Searches)+len(d.Options) > 0 {
		a.DNS = &cni.DNS{Servers: d.Servers, Searches: d.Searches, Options: d.Options}
	}
	bw, err := cni.ParseBandwidth(sb.IngressBandwidth, sb.EgressBandwidth)
	if err != nil {
		return a, fmt.Errorf("bandwidth annotations: %w", err)
	}
	a.Bandwidth = bw
	return a, nil
}

func withoutNetNS(a cni.Attachment) cni.Attachment {
	a.NetNS = ""
	return a
}

func readIPs(dir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ipsFile))
	if err != nil {
		return nil, err
	}
	var ips []string
	return ips, json.Unmarshal(b, &ips)
}

// isNamespace reports whether path is a pinned namespace (an nsfs mount).
func isNamespace(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// shmSize is the size CRI gives a pod's /dev/shm (containerd's default
// sandbox shm of 64 MiB).
const shmSize = "65536k"

// setupShm mounts the pod's /dev/shm tmpfs once; it lives in the run dir,
// so a reboot starts it empty, as a new pause container would.
func setupShm(sb *runner.Sandbox) error {
	dir := sb.ShmPath()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if mounted(dir) {
		return nil
	}
	err := unix.Mount("shm", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+shmSize)
	if err != nil {
		return fmt.Errorf("mount the pod's /dev/shm: %w", err)
	}
	return nil
}

// unmountShm removes the pod's /dev/shm; idempotent.
func unmountShm(sb *runner.Sandbox) error {
	dir := sb.ShmPath()
	if mounted(dir) {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// mounted reports whether dir is on another file system than its parent,
// which holds for the shm tmpfs.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	return unix.Stat(dir, &st) == nil && unix.Stat(filepath.Dir(dir), &parent) == nil && st.Dev != parent.Dev
}

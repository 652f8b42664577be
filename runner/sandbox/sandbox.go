// Package sandbox implements runner.Network: a pod's sandbox without a pause
// container. Its namespaces are pinned to files (cni), its network attached
// through libcni, its /dev/shm is a tmpfs beside them and, for
// shareProcessNamespace, a PID 1 of noderun's own holds its PID namespace
// (pause.go). A pod's IPs are remembered in its sandbox dir (run-dir tmpfs):
// a restarted noderun adopts a live sandbox without calling CNI, and after a
// reboot the stale allocation is released first.
package sandbox

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

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
)

// Pods adapts the cni leaf to runner.Network. It remembers a pod's IPs in
// its sandbox dir (on the run-dir tmpfs), so a restarted noderun finds a live
// sandbox without calling CNI again, while after a reboot the dir is gone and
// the stale allocation is released before the pod is attached anew.
//
// It also watches the host's links: when a pod's veth (or the bridge) is
// deleted, the pod is marked suspect and its worker poked, and its next
// Check asks the plugins, so the sandbox is repaired at once.
type Pods struct {
	cni     *cni.Manager
	podsDir string      // <run-dir>/pods, where sandbox dirs live
	holder  *cni.Holder // pods' ipc and uts namespaces (nil: in their sandbox dirs)
	cfgDirs []string    // CNI conf and bin dirs: a change there may make the network ready
	log     *slog.Logger

	mu      sync.Mutex
	ifaces  map[string]map[string]bool // host interface -> sandbox IDs using it
	suspect map[string]bool            // sandbox IDs whose interface vanished
	broken  map[string]bool            // sandbox IDs a check found broken
}

var _ runner.Network = (*Pods)(nil)

const ipsFile = "ips.json"

// New returns the sandboxes whose dirs are in podsDir; Watch follows the
// host's links and the CNI config.
func New(m *cni.Manager, podsDir string, holder *cni.Holder, cfgDirs []string, log *slog.Logger) *Pods {
	return &Pods{cni: m, podsDir: podsDir, holder: holder, cfgDirs: cfgDirs, log: log,
		ifaces: map[string]map[string]bool{}, suspect: map[string]bool{}, broken: map[string]bool{}}
}

// Setup makes the pod's namespaces, its network, its /dev/shm and, for
// shareProcessNamespace, the process that holds its PID namespace.
func (n *Pods) Setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
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
func (n *Pods) Pin(_ context.Context, sb *runner.Sandbox) error {
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

func (n *Pods) setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
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

func (n *Pods) Teardown(ctx context.Context, sb *runner.Sandbox) error {
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
func (n *Pods) Check(ctx context.Context, sb *runner.Sandbox, deep bool) error {
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
func (n *Pods) GC(ctx context.Context, keep map[string]bool) error {
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
func (n *Pods) track(sb *runner.Sandbox) {
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

func (n *Pods) untrack(id string) {
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

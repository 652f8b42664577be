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

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
)

// Pods is the sandboxes of the node's pods, each in its dir under one
// sandboxes dir (runner.SandboxesDir).
//
// It also follows the host's links (Watch): when a pod's veth (or the
// bridge) is deleted, the pod is marked suspect and its worker poked, and
// its next Check asks the plugins, so the sandbox is repaired at once.
type Pods struct {
	cni     cniManager
	dir     string      // where sandbox dirs live, one a sandbox ID
	holder  *cni.Holder // pods' ipc and uts namespaces (nil: in their sandbox dirs)
	cfgDirs []string    // CNI conf and bin dirs: a change there may make the network ready
	log     *slog.Logger

	mu      sync.Mutex
	ifaces  map[string]map[string]bool // host interface -> sandbox IDs using it
	suspect map[string]bool            // sandbox IDs whose interface vanished
	broken  map[string]bool            // sandbox IDs a check found broken
}

// cniManager is the part of *cni.Manager the sandbox calls; tests fake it.
type cniManager interface {
	Ready() error
	Attached(cni.Attachment) bool
	Add(context.Context, cni.Attachment) ([]string, error)
	Del(context.Context, cni.Attachment) error
	Check(context.Context, cni.Attachment) error
	GC(ctx context.Context, keep map[string]bool) (released []string, err error)
	HostInterfaces(cni.Attachment) []string
}

var (
	_ runner.Network = (*Pods)(nil)
	_ cniManager     = (*cni.Manager)(nil)
)

const ipsFile = "ips.json"

// Option configures Pods.
type Option func(*Pods)

// WithConfigDirs names the CNI conf and bin dirs Watch follows.
func WithConfigDirs(dirs ...string) Option { return func(p *Pods) { p.cfgDirs = dirs } }

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Pods) { p.log = l } }

// New returns the sandboxes whose dirs are in dir, attached through m. With
// holder, pods' ipc and uts namespaces are pinned in it rather than in
// their sandbox dirs.
func New(m cniManager, dir string, holder *cni.Holder, opts ...Option) *Pods {
	p := &Pods{cni: m, dir: dir, holder: holder, log: slog.New(slog.DiscardHandler),
		ifaces: map[string]map[string]bool{}, suspect: map[string]bool{}, broken: map[string]bool{}}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Setup makes the pod's namespaces, its network, its /dev/shm and, for
// shareProcessNamespace, the process that holds its PID namespace.
func (p *Pods) Setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
	ips, fresh, err := p.setup(ctx, sb)
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
func (p *Pods) Pin(_ context.Context, sb *runner.Sandbox) error {
	t0 := time.Now()
	if err := p.createNamespaces(sb, sb.HostNetwork); err != nil {
		return err
	}
	p.log.Debug("pod namespaces pinned", "sandbox", sb.ID, "took", time.Since(t0))
	if sb.HostIPC {
		return nil
	}
	return setupShm(sb)
}

func (p *Pods) setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
	if !sb.HostNetwork && isNamespace(sb.NetNSPath()) && p.sameUserNS(sb) {
		if ips, err := readIPs(sb.Dir); err == nil {
			// Repairs ipc/uts if only those went missing.
			err := p.createNamespaces(sb, false)
			p.track(sb)
			return ips, false, err
		}
	}
	if sb.HostNetwork {
		fresh := !isNamespace(sb.IPCNSPath())
		return nil, fresh, p.createNamespaces(sb, true)
	}
	att, err := attachment(sb)
	if err != nil {
		return nil, false, err
	}
	if err := p.cni.Ready(); err != nil {
		return nil, false, notReady(err)
	}
	t0 := time.Now()
	if err := p.createNamespaces(sb, false); err != nil {
		return nil, false, err
	}
	t1 := time.Now()
	// A fresh netns but an attachment left from an earlier boot or a crash
	// mid-ADD: release it first so its IP does not leak.
	if p.cni.Attached(att) {
		p.untrack(sb.ID)
		if err := p.cni.Del(ctx, withoutNetNS(att)); err != nil {
			p.log.Warn("releasing a stale pod network failed", "pod", sb.Namespace+"/"+sb.PodName, "err", err)
		}
	}
	ips, err := p.cni.Add(ctx, att)
	if err != nil {
		return nil, false, notReady(err)
	}
	p.log.Debug("pod network set up", "sandbox", sb.ID, "namespaces", t1.Sub(t0), "cni", time.Since(t1))
	p.track(sb)
	b, _ := json.Marshal(ips) // a []string always marshals
	return ips, true, os.WriteFile(filepath.Join(sb.Dir, ipsFile), b, 0o600)
}

// createNamespaces makes and pins what of the pod's namespaces is missing:
// in a user namespace of its own when it has a mapping (hostUsers: false,
// which API validation allows only without hostNetwork).
func (p *Pods) createNamespaces(sb *runner.Sandbox, hostNetwork bool) error {
	if m := sb.UserNS; m != nil {
		_, err := cni.CreateNamespacesInUserNS(sb.Dir, sb.Hostname, cni.IDMap{HostID: m.HostID, Size: m.Length}, p.holder)
		return err
	}
	if isNamespace(sb.UserNSPath()) {
		// An earlier version of the pod (same UID) had hostUsers: false:
		// its namespaces belong to that user namespace.
		if err := cni.RemoveNamespaces(sb.Dir, p.holder); err != nil {
			return err
		}
	}
	_, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, hostNetwork, p.holder)
	return err
}

// sameUserNS reports whether the pod's pinned namespaces beside the
// network's fit its user namespace setting: for hostUsers: false, all of
// them and its user namespace are there (when one is not, all are made
// anew, the network's too: cni.CreateNamespacesInUserNS); otherwise no
// user namespace is.
func (p *Pods) sameUserNS(sb *runner.Sandbox) bool {
	if sb.UserNS == nil {
		return !isNamespace(sb.UserNSPath())
	}
	return isNamespace(sb.UserNSPath()) && isNamespace(sb.IPCNSPath()) && isNamespace(sb.UTSNSPath())
}

func notReady(err error) error {
	if errors.Is(err, cni.ErrNetworkNotReady) {
		return fmt.Errorf("%w: %w", runner.ErrNetworkNotReady, err)
	}
	return err
}

func (p *Pods) Teardown(ctx context.Context, sb *runner.Sandbox) error {
	p.mu.Lock()
	broken := p.broken[sb.ID]
	delete(p.broken, sb.ID)
	p.mu.Unlock()
	p.untrack(sb.ID) // our own DEL removes the veth: not a breakage
	var errs []error
	if !sb.HostNetwork {
		att, _ := attachment(sb) // DEL needs no bandwidth: a bad annotation is no reason to leak
		if broken {
			// Its interface is gone, so the plugins cannot find what it
			// held through the netns: released by ID instead.
			att = withoutNetNS(att)
		}
		errs = append(errs, p.cni.Del(ctx, att))
	}
	if err := os.Remove(filepath.Join(sb.Dir, ipsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, stopPause(sb), unmountShm(sb), cni.RemoveNamespaces(sb.Dir, p.holder))
	return errors.Join(errs...)
}

// Check finds a sandbox whose pinned netns vanished; deeply, or when one of
// its host interfaces was deleted, it asks the plugins (CNI CHECK).
func (p *Pods) Check(ctx context.Context, sb *runner.Sandbox, deep bool) error {
	if !isNamespace(sb.NetNSPath()) {
		return fmt.Errorf("%w: %s is not a network namespace", runner.ErrSandboxBroken, sb.NetNSPath())
	}
	p.mu.Lock()
	suspect := p.suspect[sb.ID]
	delete(p.suspect, sb.ID)
	p.mu.Unlock()
	if !deep && !suspect {
		return nil
	}
	att, _ := attachment(sb)
	err := p.cni.Check(ctx, att)
	if errors.Is(err, cni.ErrCheckFailed) {
		p.mu.Lock()
		p.broken[sb.ID] = true
		p.mu.Unlock()
		return fmt.Errorf("%w: %w", runner.ErrSandboxBroken, err)
	}
	return err
}

// GC releases CNI leftovers and removes pinned namespaces of sandboxes
// noderun no longer knows.
func (p *Pods) GC(ctx context.Context, keep map[string]bool) error {
	released, err := p.cni.GC(ctx, keep)
	if len(released) > 0 {
		p.log.Info("released leftover pod networks", "sandboxes", released)
	}
	errs := []error{err}
	ents, err := os.ReadDir(p.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	removed := map[string]bool{}
	for _, d := range ents {
		if d.IsDir() && !keep[d.Name()] {
			dir := filepath.Join(p.dir, d.Name())
			p.log.Info("removing leftover pod sandbox", "dir", dir)
			for _, f := range append([]string{ipsFile}, runner.SandboxFiles...) {
				if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			sb := &runner.Sandbox{Dir: dir}
			errs = append(errs, runner.RemovePodFiles(dir), stopPause(sb), unmountShm(sb), cni.RemoveNamespaces(dir, p.holder))
			removed[d.Name()] = true
		}
	}
	if p.holder == nil {
		return errors.Join(errs...)
	}
	// Namespaces whose sandbox dir is gone (a crash while it was removed).
	ids, err := p.holder.IDs()
	errs = append(errs, err)
	for _, id := range ids {
		if !keep[id] && !removed[id] {
			p.log.Info("removing leftover pod namespaces", "sandbox", id)
			errs = append(errs, cni.RemoveNamespaces(filepath.Join(p.dir, id), p.holder))
		}
	}
	return errors.Join(errs...)
}

// track remembers which host interfaces the sandbox uses.
func (p *Pods) track(sb *runner.Sandbox) {
	att, _ := attachment(sb)
	names := p.cni.HostInterfaces(att)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range names {
		if p.ifaces[name] == nil {
			p.ifaces[name] = map[string]bool{}
		}
		p.ifaces[name][sb.ID] = true
	}
}

func (p *Pods) untrack(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, ids := range p.ifaces {
		delete(ids, id)
		if len(ids) == 0 {
			delete(p.ifaces, name)
		}
	}
	delete(p.suspect, id)
	delete(p.broken, id)
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

// isNamespace reports whether path is a pinned namespace; one that cannot
// be told (statfs fails) counts as gone, as a missing one does.
func isNamespace(path string) bool {
	ns, _ := cni.IsNamespace(path)
	return ns
}

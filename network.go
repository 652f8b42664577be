package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
)

// network adapts the cni leaf to runner.Network. It remembers a pod's IPs in
// its sandbox dir (on the run-dir tmpfs), so a restarted noderun finds a live
// sandbox without calling CNI again, while after a reboot the dir is gone and
// the stale allocation is released before the pod is attached anew.
type network struct {
	cni     *cni.Manager
	podsDir string // <run-dir>/pods, where sandbox dirs live
	log     *slog.Logger
}

var _ runner.Network = (*network)(nil)

const ipsFile = "ips.json"

func (n *network) Setup(ctx context.Context, sb *runner.Sandbox) ([]string, bool, error) {
	if !sb.HostNetwork && isNamespace(sb.NetNSPath()) {
		if ips, err := readIPs(sb.Dir); err == nil {
			// Repairs ipc/uts if only those went missing.
			_, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, false)
			return ips, false, err
		}
	}
	if sb.HostNetwork {
		fresh := !isNamespace(sb.IPCNSPath())
		_, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, true)
		return nil, fresh, err
	}
	if _, err := cni.CreateNamespaces(sb.Dir, sb.Hostname, false); err != nil {
		return nil, false, err
	}
	att := attachment(sb)
	// A fresh netns but an attachment left from an earlier boot or a crash
	// mid-ADD: release it first so its IP does not leak.
	if n.cni.Attached(att) {
		if err := n.cni.Del(ctx, withoutNetNS(att)); err != nil {
			n.log.Warn("releasing a stale pod network failed", "pod", sb.Namespace+"/"+sb.PodName, "err", err)
		}
	}
	ips, err := n.cni.Add(ctx, att)
	if err != nil {
		return nil, false, err
	}
	b, _ := json.Marshal(ips) // a []string always marshals
	return ips, true, os.WriteFile(filepath.Join(sb.Dir, ipsFile), b, 0o600)
}

func (n *network) Teardown(ctx context.Context, sb *runner.Sandbox) error {
	var errs []error
	if !sb.HostNetwork {
		errs = append(errs, n.cni.Del(ctx, attachment(sb)))
	}
	if err := os.Remove(filepath.Join(sb.Dir, ipsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	errs = append(errs, cni.RemoveNamespaces(sb.Dir))
	return errors.Join(errs...)
}

// Check finds a sandbox whose pinned netns vanished.
func (n *network) Check(_ context.Context, sb *runner.Sandbox, _ bool) error {
	if !isNamespace(sb.NetNSPath()) {
		return fmt.Errorf("%w: %s is not a network namespace", runner.ErrSandboxBroken, sb.NetNSPath())
	}
	return nil
}

// GC removes pinned namespaces of sandboxes noderun no longer knows.
func (n *network) GC(_ context.Context, keep map[string]bool) error {
	ents, err := os.ReadDir(n.podsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, d := range ents {
		if d.IsDir() && !keep[d.Name()] {
			dir := filepath.Join(n.podsDir, d.Name())
			n.log.Info("removing leftover pod sandbox", "dir", dir)
			if err := os.Remove(filepath.Join(dir, ipsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			errs = append(errs, cni.RemoveNamespaces(dir))
		}
	}
	return errors.Join(errs...)
}

func attachment(sb *runner.Sandbox) cni.Attachment {
	a := cni.Attachment{
		ID: sb.ID, NetNS: sb.NetNSPath(),
		PodNamespace: sb.Namespace, PodName: sb.PodName, PodUID: sb.PodUID,
	}
	for _, p := range sb.Ports {
		a.PortMappings = append(a.PortMappings, cni.PortMapping{
			HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: p.Protocol, HostIP: p.HostIP})
	}
	return a
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

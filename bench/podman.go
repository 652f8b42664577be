package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// podman is `podman kube play` on storage, run state, network config and
// a bridge of the bench's own (through a containers.conf of its own), so
// it shares nothing with another podman on the machine.
type podman struct {
	dir, conf, network string
	bridge             string // the one podman picked: 4.3 takes no name for it
}

// startPodman writes the config, loads the bench's image and creates the
// network. Podman has no daemon: each command is the agent.
func startPodman(ctx context.Context, e *env, subnet string) (p *podman, retErr error) {
	if _, err := exec.LookPath("podman"); err != nil {
		return nil, fmt.Errorf("podman: %w (apt-get install podman)", err)
	}
	dir := filepath.Join(e.dir, "podman")
	p = &podman{dir: dir, conf: filepath.Join(dir, "containers.conf"), network: "nrbench-" + filepath.Base(e.dir)}
	defer func() {
		if retErr != nil {
			retErr = errors.Join(retErr, p.close())
		}
	}()
	if err := e.runState(filepath.Join(dir, "run")); err != nil {
		return p, err
	}
	conf := fmt.Sprintf(`[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
[network]
network_backend = "netavark"
network_config_dir = %q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "run", "tmp"), filepath.Join(dir, "net"))
	if err := os.WriteFile(p.conf, []byte(conf), 0o644); err != nil {
		return p, err
	}
	if _, err := p.run(ctx, "load", "-q", "-i", e.imageTar); err != nil {
		return p, err
	}
	if _, err := p.run(ctx, "network", "create", "--subnet", subnet, p.network); err != nil {
		return p, err
	}
	out, err := p.run(ctx, "network", "inspect", "--format", "{{.NetworkInterface}}", p.network)
	p.bridge = strings.TrimSpace(string(out))
	return p, err
}

// run runs one podman command on the bench's storage.
func (p *podman) run(ctx context.Context, args ...string) ([]byte, error) {
	args = append([]string{"--root", filepath.Join(p.dir, "root"), "--runroot", filepath.Join(p.dir, "run", "state"),
		"--storage-driver", "overlay"}, args...)
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("podman %s: %w: %s", strings.Join(args[6:], " "), err, stderr.Bytes())
	}
	return out, nil
}

// writePods writes the pods, shaped by spec if set, into one
// multi-document manifest; the start is `podman kube play` of it.
func (p *podman) writePods(names []string, spec func(*v1.PodSpec)) (string, error) {
	var docs [][]byte
	for _, n := range names {
		docs = append(docs, podJSON(n, spec))
	}
	path := filepath.Join(p.dir, names[0]+".yaml")
	return path, os.WriteFile(path, bytes.Join(docs, []byte("\n---\n")), 0o644)
}

// play starts the manifest's pods and returns when podman lists every
// one with all its containers running (its own API: podman pod ps).
func (p *podman) play(ctx context.Context, path string, n int) (time.Duration, error) {
	t0 := time.Now()
	if _, err := p.run(ctx, "kube", "play", "--network", p.network, path); err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(waitTimeout); ; {
		out, err := p.run(ctx, "pod", "ps", "--format", "{{.Status}}")
		if err != nil {
			return 0, err
		}
		if strings.Count(string(out), "Running") == n {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("podman: pods not Running after %s: %s", waitTimeout, out)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// down removes the manifest's pods (`podman kube down`) and returns
// when no pod is left.
func (p *podman) down(ctx context.Context, path string) (time.Duration, error) {
	t0 := time.Now()
	if _, err := p.run(ctx, "kube", "down", path); err != nil {
		return 0, err
	}
	out, err := p.run(ctx, "pod", "ps", "-q")
	if err != nil {
		return 0, err
	}
	if len(bytes.TrimSpace(out)) > 0 {
		return 0, fmt.Errorf("podman: pods left after kube down: %s", out)
	}
	return time.Since(t0), os.Remove(path)
}

// close removes every pod, the network with its bridge and the pods'
// cgroup parent; the env's close unmounts what the storage left mounted.
// Netavark's empty base chains in iptables stay, as podman leaves them.
func (p *podman) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTime)
	defer cancel()
	var errs []error
	if _, err := os.Stat(p.conf); err != nil {
		return nil
	}
	if _, err := p.run(ctx, "pod", "rm", "-a", "-f", "-t", "0"); err != nil {
		errs = append(errs, err)
	}
	if _, err := p.run(ctx, "network", "rm", "-f", p.network); err != nil && !strings.Contains(err.Error(), "no such network") {
		errs = append(errs, err)
	}
	if p.bridge != "" {
		errs = append(errs, deleteLink(p.bridge))
	}
	// kube play's pods go under podman's default cgroup parent; it stays,
	// with a child per pod in the named hierarchies (systemd, unified),
	// empty. Only empty cgroups are removed: another podman's stay.
	for _, m := range cgroupMounts() {
		removeTree(filepath.Join(m, "libpod_parent"))
	}
	return errors.Join(errs...)
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/volume"
)

// layout is every path the node owns under its three directories, resolved
// from the flags: run makes what it names and reset removes exactly that
// (stateOwned, runOwned), so a path the node gains is added here once.
type layout struct {
	state, run, podLogs string
	socket              string // --status-socket; may lie outside run
	images              string // --images-dir; may lie outside state
}

// resolveLayout resolves the dir flags (resolveDirs; with create the
// daemon makes them) and names the node's paths under them.
func resolveLayout(c *cli.Context, create bool) (layout, error) {
	if err := resolveDirs(c, create); err != nil {
		return layout{}, err
	}
	l := layout{state: c.String("state-dir"), run: c.String("run-dir"), podLogs: c.String("pod-log-dir"),
		socket: c.String("status-socket"), images: c.String("images-dir")}
	if l.socket == "" {
		l.socket = kubeapi.StatusSocket(l.run)
	}
	if l.images == "" {
		l.images = filepath.Join(l.state, "images")
	}
	return l, nil
}

// The state dir: pods' state, what the node keeps across reboots.
func (l layout) sources() string      { return filepath.Join(l.state, "sources") }      // URL sources' last good responses
func (l layout) apiDir() string       { return kubeapi.CredentialsDir(l.state) }        // the API's CA, certificate, tokens
func (l layout) cniCache() string     { return filepath.Join(l.state, "cni", "cache") } // libcni's results
func (l layout) driverBin() string    { return filepath.Join(l.state, "bin") }          // the embedded log driver
func (l layout) importLedger() string { return filepath.Join(l.state, "image-imports.json") }
func (l layout) seccomp() string      { return filepath.Join(l.state, "seccomp") }     // an input: Localhost profiles
func (l layout) registryAuth() string { return filepath.Join(l.state, "config.json") } // an input: credentials

// The run dir: a tmpfs, emptied by a reboot.
func (l layout) apiServerFile() string   { return kubeapi.ServerFile(l.run) }                  // the API's URL, for clients
func (l layout) sandboxes() string       { return runner.SandboxesDir(l.run) }                 // pods' sandbox dirs
func (l layout) nsHolder() string        { return filepath.Join(l.run, "ns") }                 // pinned namespaces' holder
func (l layout) runc() string            { return filepath.Join(l.run, "runc") }               // runc's state
func (l layout) tmpMounts() string       { return filepath.Join(l.run, "tmpmounts") }          // containerd's temporary mounts
func (l layout) collectorSocket() string { return filepath.Join(l.run, "log-collector.sock") } // root only

// stateInputs are what an admin puts in the state dir for noderun to read
// (image tarballs, Localhost seccomp profiles, registry credentials): reset
// keeps them, as it keeps the manifests, and removes them only when empty.
var stateInputs = []string{"images", "seccomp", "config.json"}

// stateOwned and runOwned are the names noderun (and a containerd it
// manages) makes in --state-dir and --run-dir: reset removes these and
// nothing else. Besides the paths above: the engine's pods (runner), the
// single-instance lock (lock.go), the containerd choice and a managed
// containerd (runner/containerd/daemon), the log collector's lock and
// stderr (crilog, logcollector.go).
var (
	stateOwned = []string{"pods", "sources", "api", "cni", "bin", "containerd", "containerd.json", "image-imports.json", "lock"}
	runOwned   = []string{"pods", "ns", "runc", "tmpmounts", "containerd", "lock", "noderun.sock", "api-server",
		"log-collector.sock", "log-collector.sock.lock", "log-collector.stderr"}
)

// dirFlags name the directories noderun makes things in and removes them
// from: pods' state, run-time files and logs.
var dirFlags = []string{"state-dir", "run-dir", "pod-log-dir"}

// sharedDirs hold what many programs keep, beside / and every directory
// right under it (/var, /data, /home, /run, ...): none of them can be a
// directory of noderun's own.
var sharedDirs = []string{
	"/var/lib", "/var/log", "/var/cache", "/var/tmp", "/var/spool", "/var/local", "/var/opt", "/var/mail",
	"/usr/local", "/usr/lib", "/usr/share", "/run/user", "/run/lock",
}

// resolveDirs makes each dir flag absolute with every link resolved, and
// sets the flag to that: the mount table names mounts by such paths, and a
// link changed later must not move what removal acts on. With create the
// dirs are made first (the daemon); reset makes none. It refuses a dir
// that is a system directory or overlaps another: removing noderun's
// things from it could remove other programs' or each other's.
func resolveDirs(c *cli.Context, create bool) error {
	real := make([]string, len(dirFlags))
	for i, name := range dirFlags {
		dir := c.String(name)
		if dir == "" {
			return fmt.Errorf("--%s is empty", name)
		}
		if create {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("--%s: %w", name, err)
			}
		}
		r, err := volume.ResolvePath(dir)
		if err != nil {
			return fmt.Errorf("--%s %s: %w", name, dir, err)
		}
		if why := systemDir(r); why != "" {
			return fmt.Errorf("--%s %s: %s: give a directory of noderun's own, such as %s/noderun", name, dir, why, r)
		}
		real[i] = r
	}
	for i := range real {
		for j := i + 1; j < len(real); j++ {
			if within(real[i], real[j]) || within(real[j], real[i]) {
				return fmt.Errorf("--%s %s and --%s %s overlap: each must be a directory of its own, neither inside the other",
					dirFlags[i], real[i], dirFlags[j], real[j])
			}
		}
	}
	for i, name := range dirFlags {
		if err := c.Set(name, real[i]); err != nil {
			return err
		}
	}
	return nil
}

// systemDir says why dir (absolute, resolved) is not one noderun may use
// as its own, or "" when it may.
func systemDir(dir string) string {
	switch {
	case dir == "/":
		return "the root directory"
	case filepath.Dir(dir) == "/":
		return "a top-level directory"
	case slices.Contains(sharedDirs, dir):
		return "a system directory"
	case within(dir, "/proc") || within(dir, "/sys") || within(dir, "/dev"):
		return "on a kernel file system"
	case filepath.Dir(dir) == "/home" || filepath.Dir(dir) == "/run/user":
		return "a home directory"
	}
	if home, err := os.UserHomeDir(); err == nil && filepath.Clean(home) == dir {
		return "the home directory"
	}
	return ""
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

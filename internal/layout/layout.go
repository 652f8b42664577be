// Package layout is the node's directories: every path noderun owns under
// its state, run and pod log dirs, named once, so that run makes what reset
// removes. It resolves the dir flags and refuses a dir that is not one of
// noderun's own, holds the single-instance lock on them, and removes what
// the node made there (reset). It names paths; it starts nothing.
package layout

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/runner"
	"github.com/noderun/noderun/runner/volume"
)

// Layout is every path the node owns under its three directories, resolved
// from the flags: run makes what it names and reset removes exactly that
// (stateOwned, runOwned), so a path the node gains is added here once.
type Layout struct {
	State, Run, PodLogs string
	Socket              string // --status-socket; may lie outside Run
	Images              string // --images-dir; may lie outside State
}

// Flags are the dir flags as given: --state-dir, --run-dir, --pod-log-dir,
// --status-socket and --images-dir (those two "" for their defaults).
type Flags struct {
	State, Run, PodLogs, Socket, Images string
}

// Resolve resolves the dir flags (resolveDirs; with create the daemon
// makes them) and names the node's paths under them.
func Resolve(f Flags, create bool) (Layout, error) {
	dirs, err := resolveDirs([]string{f.State, f.Run, f.PodLogs}, create)
	if err != nil {
		return Layout{}, err
	}
	l := Layout{State: dirs[0], Run: dirs[1], PodLogs: dirs[2], Socket: f.Socket, Images: f.Images}
	if l.Socket == "" {
		l.Socket = kubeapi.StatusSocket(l.Run)
	}
	if l.Images == "" {
		l.Images = filepath.Join(l.State, "images")
	}
	return l, nil
}

// The state dir: pods' state, what the node keeps across reboots.
func (l Layout) Sources() string      { return filepath.Join(l.State, "sources") }      // URL sources' last good responses
func (l Layout) APIPods() string      { return filepath.Join(l.State, "api-pods") }     // pods made through the API (kubectl debug node)
func (l Layout) APIDir() string       { return kubeapi.CredentialsDir(l.State) }        // the API's CA, certificate, tokens
func (l Layout) CNICache() string     { return filepath.Join(l.State, "cni", "cache") } // libcni's results
func (l Layout) DriverBin() string    { return filepath.Join(l.State, "bin") }          // the embedded log driver
func (l Layout) ImportLedger() string { return filepath.Join(l.State, "image-imports.json") }
func (l Layout) Seccomp() string      { return filepath.Join(l.State, "seccomp") }     // an input: Localhost profiles
func (l Layout) RegistryAuth() string { return filepath.Join(l.State, "config.json") } // an input: credentials

// The run dir: a tmpfs, emptied by a reboot.
func (l Layout) APIServerFile() string   { return kubeapi.ServerFile(l.Run) }                  // the API's URL, for clients
func (l Layout) Sandboxes() string       { return runner.SandboxesDir(l.Run) }                 // pods' sandbox dirs
func (l Layout) NSHolder() string        { return filepath.Join(l.Run, "ns") }                 // pinned namespaces' holder
func (l Layout) Runc() string            { return filepath.Join(l.Run, "runc") }               // runc's state
func (l Layout) TmpMounts() string       { return filepath.Join(l.Run, "tmpmounts") }          // containerd's temporary mounts
func (l Layout) CollectorSocket() string { return filepath.Join(l.Run, "log-collector.sock") } // root only

// stateInputs are what an admin puts in the state dir for noderun to read
// (image tarballs, Localhost seccomp profiles, registry credentials): reset
// keeps them, as it keeps the manifests, and removes them only when empty.
var stateInputs = []string{"images", "seccomp", "config.json"}

// stateOwned and runOwned are the names noderun (and a containerd it
// manages) makes in --state-dir and --run-dir: reset removes these and
// nothing else. Besides the paths above: the engine's pods and the last
// Ready version of each pod with its rollback (runner), the
// single-instance lock (lock.go), the containerd choice and a managed
// containerd (runner/containerd/daemon), the exec and container stdio FIFOs
// beside runc's state (runner/containerd), the log collector's lock and
// stderr (crilog, main's logcollector.go).
var (
	stateOwned = []string{"pods", "rollback", "sources", "api-pods", "api", "cni", "bin", "containerd", "containerd.json", "image-imports.json", "lock"}
	runOwned   = []string{"pods", "ns", "runc", "exec-fifo", "stdio", "tmpmounts", "containerd", "lock", "noderun.sock", "api-server",
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

// resolveDirs makes each dir (as the dirFlags give them) absolute with
// every link resolved: the mount table names mounts by such paths, and a
// link changed later must not move what removal acts on. With create the
// dirs are made first (the daemon); reset makes none. It refuses a dir
// that is a system directory or overlaps another: removing noderun's
// things from it could remove other programs' or each other's.
func resolveDirs(dirs []string, create bool) ([]string, error) {
	real := make([]string, len(dirFlags))
	for i, name := range dirFlags {
		dir := dirs[i]
		if dir == "" {
			return nil, fmt.Errorf("--%s is empty", name)
		}
		if create {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("--%s: %w", name, err)
			}
		}
		r, err := volume.ResolvePath(dir)
		if err != nil {
			return nil, fmt.Errorf("--%s %s: %w", name, dir, err)
		}
		if why := systemDir(r); why != "" {
			return nil, fmt.Errorf("--%s %s: %s: give a directory of noderun's own, such as %s/noderun", name, dir, why, r)
		}
		real[i] = r
	}
	for i := range real {
		for j := i + 1; j < len(real); j++ {
			if within(real[i], real[j]) || within(real[j], real[i]) {
				return nil, fmt.Errorf("--%s %s and --%s %s overlap: each must be a directory of its own, neither inside the other",
					dirFlags[i], real[i], dirFlags[j], real[j])
			}
		}
	}
	return real, nil
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

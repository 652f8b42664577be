package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/noderun/noderun/internal/atomicfile"
)

// ErrChanged means the flags ask for another containerd than the one
// recorded in the state dir.
var ErrChanged = errors.New("containerd differs from the recorded one")

// systemdUnitDirs are where systemd looks for a system unit file.
var systemdUnitDirs = []string{
	"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
	"/usr/lib/systemd/system", "/lib/systemd/system",
}

// systemService names the service manager that will start a system
// containerd on this host, and where its service is, or returns "" when
// none will: a containerd service must be installed for a service manager
// that is running. A unit file alone is not enough: Debian's containerd
// package ships containerd.service on hosts where systemd is not PID 1 (a
// container, a sysvinit or OpenRC host), and nothing ever starts it there.
// Paths are looked up under root ("/" on a host).
func systemService(root string) string {
	at := func(p string) string { return filepath.Join(root, p) }
	// systemd runs when /run/systemd/system exists (sd_booted).
	if exists(root, "/run/systemd/system") {
		for _, dir := range systemdUnitDirs {
			if unit := filepath.Join(dir, "containerd.service"); exists(root, unit) {
				return "systemd will start it (" + unit + ")"
			}
		}
		return ""
	}
	// OpenRC runs when /run/openrc exists.
	if exists(root, "/run/openrc") && exists(root, "/etc/init.d/containerd") {
		return "OpenRC will start it (/etc/init.d/containerd)"
	}
	// s6 keeps its live service dirs in /run, so they exist only while it
	// runs.
	for _, dir := range []string{"/run/service/containerd", "/run/s6-rc/servicedirs/containerd"} {
		if exists(root, dir) {
			return "s6 will start it (" + dir + ")"
		}
	}
	// runit's runsv makes a service's supervise dir when it runs it.
	for _, dir := range []string{"/etc/service/containerd", "/var/service/containerd", "/etc/runit/runsvdir/current/containerd"} {
		if exists(root, filepath.Join(dir, "supervise")) {
			return "runit will start it (" + dir + ")"
		}
	}
	// sysvinit as PID 1, with containerd in a multi-user runlevel.
	if comm, err := os.ReadFile(at("/proc/1/comm")); err == nil && strings.TrimSpace(string(comm)) == "init" {
		if links, _ := filepath.Glob(at("/etc/rc[2-5].d/S*containerd")); len(links) > 0 {
			return "sysvinit will start it (" + strings.TrimPrefix(links[0], filepath.Clean(root)) + ")"
		}
	}
	return ""
}

// hostRoot is where the host's service managers are looked up.
func (cfg Config) hostRoot() string {
	if cfg.Root == "" {
		return "/"
	}
	return cfg.Root
}

// exists tells whether path exists under root.
func exists(root, path string) bool {
	_, err := os.Stat(filepath.Join(root, path))
	return err == nil
}

// Choice is the containerd noderun uses. It is recorded in the state dir at
// the first successful connect and kept on every later start: pods live in
// one daemon, and switching would run them twice.
type Choice struct {
	Address string `json:"address"`
	Managed bool   `json:"managed"` // started and supervised by noderun
}

func choicePath(stateDir string) string { return filepath.Join(stateDir, "containerd.json") }

// readChoice returns the recorded choice; ok is false when none is.
func readChoice(stateDir string) (c Choice, ok bool, err error) {
	b, err := os.ReadFile(choicePath(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return Choice{}, false, nil
	}
	if err != nil {
		return Choice{}, false, err
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Address == "" {
		return Choice{}, false, fmt.Errorf("%s: not a containerd choice (%v); remove it to choose again", choicePath(stateDir), err)
	}
	return c, true, nil
}

func writeChoice(stateDir string, c Choice) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(choicePath(stateDir), append(b, '\n'), 0o644)
}

// agrees checks that the flags do not ask for another daemon than the
// recorded one. A recorded managed daemon is kept even when the flags do
// not ask for it: it was chosen because no containerd was installed, and
// its pods are in it.
func (cfg Config) agrees(c Choice) error {
	switch {
	case c.Managed:
		return nil
	case cfg.Managed:
		return cfg.changed(c, "a managed containerd")
	case c.Address != cfg.Address:
		return cfg.changed(c, cfg.Address)
	}
	return nil
}

func (cfg Config) changed(c Choice, want string) error {
	return fmt.Errorf("%w: %s records the containerd at %s, the flags ask for %s; noderun does not switch, "+
		"since the pods in the old one would keep running without an owner: stop them there, then remove %[2]s",
		ErrChanged, choicePath(cfg.StateDir), c.Address, want)
}

// choose picks the containerd on a start with nothing recorded; why says
// what made it choose (logged by Connect). A system containerd at
// cfg.Address is chosen when one answers there, or when one is on its way:
// a running service manager will start it (systemService), or its socket
// accepts connections (a containerd starting, or busy). A managed
// containerd is chosen when asked for (cfg.Managed), when an earlier
// noderun's managed one answers, and when no one will start a system one,
// given a containerd binary on PATH to run it with (without one it is
// ErrNoContainerd, unless a socket file shows a containerd installed
// elsewhere). Leftovers are no sign of a coming daemon: a stale socket, or
// its directory, which containerd never removes and every containerd's
// shims create (/run/containerd/s), make noderun wait for ever on a host
// whose PID 1 is not systemd, where Debian's package installs a unit file
// that nothing starts.
func (cfg Config) choose(ctx context.Context) (c Choice, why string, err error) {
	system := Choice{Address: cfg.Address}
	managed := Choice{Address: cfg.managedSocket(), Managed: true}
	if cfg.Managed {
		return managed, "--containerd-managed", nil
	}
	if answers(ctx, cfg.Address) {
		return system, "it answers", nil
	}
	// Left by a noderun from before the choice was recorded.
	if answers(ctx, managed.Address) {
		return managed, "an earlier noderun's managed containerd answers at " + managed.Address, nil
	}
	root := cfg.hostRoot()
	if svc := systemService(root); svc != "" {
		return system, svc, nil
	}
	socket := strings.TrimPrefix(cfg.Address, "unix://")
	if listening(socket) {
		return system, "its socket " + socket + " accepts connections (a containerd starting, or busy)", nil
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		if _, err := os.Stat(socket); err == nil {
			return system, "its socket " + socket + " exists, and there is no containerd binary on PATH to run a managed one with", nil
		}
		return Choice{}, "", fmt.Errorf("%w: nothing answers at %q and there is no containerd binary on PATH: "+
			"install it (apt-get install containerd runc) or point --containerd-address at a running containerd",
			ErrNoContainerd, cfg.Address)
	}
	return managed, "nothing answers at " + cfg.Address + " and nothing will start a containerd there: " + noService(root), nil
}

// noService says why no service manager will start containerd, naming a
// service that is installed for one that is not running.
func noService(root string) string {
	for _, dir := range systemdUnitDirs {
		if unit := filepath.Join(dir, "containerd.service"); exists(root, unit) {
			return unit + " is installed, but systemd is not running (no /run/systemd/system)"
		}
	}
	if exists(root, "/etc/init.d/containerd") {
		return "/etc/init.d/containerd is installed, but no service manager that runs it is running"
	}
	return "no service manager has a containerd service"
}

// listening tells whether a process accepts connections on the unix socket
// at path: a socket file left by a containerd that was killed refuses them.
func listening(path string) bool {
	conn, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func answers(ctx context.Context, address string) bool {
	c, err := dial(ctx, address, "")
	if err != nil {
		return false
	}
	c.Close()
	return true
}

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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
	exists := func(p string) bool { _, err := os.Stat(at(p)); return err == nil }
	// systemd runs when /run/systemd/system exists (sd_booted).
	if exists("/run/systemd/system") {
		for _, dir := range systemdUnitDirs {
			if unit := filepath.Join(dir, "containerd.service"); exists(unit) {
				return "systemd will start it (" + unit + ")"
			}
		}
		return ""
	}
	// OpenRC runs when /run/openrc exists.
	if exists("/run/openrc") && exists("/etc/init.d/containerd") {
		return "OpenRC will start it (/etc/init.d/containerd)"
	}
	// s6 keeps its live service dirs in /run, so they exist only while it
	// runs.
	for _, dir := range []string{"/run/service/containerd", "/run/s6-rc/servicedirs/containerd"} {
		if exists(dir) {
			return "s6 will start it (" + dir + ")"
		}
	}
	// runit's runsv makes a service's supervise dir when it runs it.
	for _, dir := range []string{"/etc/service/containerd", "/var/service/containerd", "/etc/runit/runsvdir/current/containerd"} {
		if exists(filepath.Join(dir, "supervise")) {
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

// choose picks the containerd on a start with nothing recorded. A managed
// containerd is chosen only when asked for (cfg.Managed) or when no
// containerd is installed, that is when all of these hold:
//   - nothing answers at cfg.Address, and no managed containerd of an
//     earlier noderun answers either;
//   - neither the socket nor its directory exists: containerd creates the
//     directory and never removes it, so on /run (a tmpfs) this means that
//     no containerd has served there since boot;
//   - no running service manager will start a system containerd
//     (systemService: a system containerd that is not up yet);
//   - a containerd binary is on PATH (to run the managed one with; without
//     one, and with no socket, it is ErrNoContainerd).
//
// Otherwise it chooses cfg.Address, to be waited for; why says what makes
// it expect a containerd there.
func (cfg Config) choose(ctx context.Context) (c Choice, why string, err error) {
	system := Choice{Address: cfg.Address}
	managed := Choice{Address: cfg.managedSocket(), Managed: true}
	if cfg.Managed {
		return managed, "", nil
	}
	if answers(ctx, cfg.Address) {
		return system, "it answers", nil
	}
	// Left by a noderun from before the choice was recorded.
	if answers(ctx, managed.Address) {
		return managed, "", nil
	}
	socket := strings.TrimPrefix(cfg.Address, "unix://")
	if _, err := os.Stat(socket); !errors.Is(err, fs.ErrNotExist) {
		return system, "its socket " + socket + " exists (a containerd starting, or busy)", nil
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		return Choice{}, "", fmt.Errorf("%w: nothing answers at %q and there is no containerd binary on PATH: "+
			"install it (apt-get install containerd runc) or point --containerd-address at a running containerd",
			ErrNoContainerd, cfg.Address)
	}
	if _, err := os.Stat(filepath.Dir(socket)); !errors.Is(err, fs.ErrNotExist) {
		return system, "its directory " + filepath.Dir(socket) + " exists: a containerd has served there since boot", nil
	}
	root := cfg.Root
	if root == "" {
		root = "/"
	}
	if svc := systemService(root); svc != "" {
		return system, svc, nil
	}
	return managed, "", nil
}

func answers(ctx context.Context, address string) bool {
	c, err := dial(ctx, address, "")
	if err != nil {
		return false
	}
	c.Close()
	return true
}

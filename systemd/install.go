package systemd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/noderun/noderun/internal/atomicfile"
)

const (
	unitName = "noderun.service"
	// PodsDir is the manifest directory the unit's ExecStart names.
	PodsDir = "/etc/noderun/pods"
	// EnvFile is the unit's optional EnvironmentFile: NODERUN_* settings
	// (and any other variable the daemon should see).
	EnvFile = "/etc/noderun/env"
	// unitExecStart is the binary path in the shipped unit file, replaced
	// by the one actually installed.
	unitExecStart = "\nExecStart=/usr/local/bin/noderun "
)

// Installation is what `noderun install` puts in place. Paths other than
// Root are as seen on the installed system; Root prefixes them all.
type Installation struct {
	Root    string // "/" or a directory that becomes a system's root (an image, a test)
	Prefix  string // the binary goes to <Prefix>/bin/noderun
	UnitDir string
	Binary  string // the file to install
	// Systemd is true when systemd manages Root: daemon-reload and enable
	// are run through the systemctl in PATH; otherwise they are printed.
	Systemd bool
	Out     io.Writer
}

// Booted is sd_booted(3): systemd creates this directory when it
// runs as PID 1.
func Booted() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// Install puts the binary, the unit file and the manifest directory in
// place, each replaced atomically, so that a second run, or a run after
// one interrupted at any step, ends in the same state.
func Install(in Installation) error {
	for _, f := range [][2]string{{"--root", in.Root}, {"--prefix", in.Prefix}, {"--unit-dir", in.UnitDir}} {
		if !filepath.IsAbs(f[1]) {
			return fmt.Errorf("%s %q: want an absolute path", f[0], f[1])
		}
	}
	binPath := filepath.Join(in.Prefix, "bin", "noderun")
	under := func(p string) string { return filepath.Join(in.Root, p) }

	unit, err := unitFor(binPath)
	if err != nil {
		return err
	}
	if err := installFile(in.Binary, under(binPath), 0o755); err != nil {
		return err
	}
	fmt.Fprintln(in.Out, "installed", binPath)
	if err := writeFile(under(filepath.Join(in.UnitDir, unitName)), []byte(unit), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(in.Out, "installed", filepath.Join(in.UnitDir, unitName))
	if err := os.MkdirAll(under(PodsDir), 0o755); err != nil {
		return err
	}
	fmt.Fprintln(in.Out, "manifests go in", PodsDir)

	steps := [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", unitName}}
	if !in.Systemd {
		why := "systemd is not running here (PID 1 is not systemd)"
		if filepath.Clean(in.Root) != "/" {
			why = "installed beneath " + in.Root
		}
		fmt.Fprintf(in.Out, "%s; steps left, on the system once systemd runs it:\n", why)
		for _, s := range steps {
			fmt.Fprintln(in.Out, "  "+strings.Join(s, " "))
		}
		fmt.Fprintln(in.Out, "  systemctl start noderun")
		return nil
	}
	for _, s := range steps {
		cmd := exec.Command(s[0], s[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
		fmt.Fprintln(in.Out, "ran", strings.Join(s, " "))
	}
	fmt.Fprintln(in.Out, "start it with: systemctl start noderun")
	return nil
}

// unitFor is the shipped unit file with ExecStart naming bin.
func unitFor(bin string) (string, error) {
	if !strings.Contains(Unit, unitExecStart) {
		return "", errors.New("the embedded unit file has no ExecStart=/usr/local/bin/noderun line")
	}
	return strings.Replace(Unit, unitExecStart, "\nExecStart="+bin+" ", 1), nil
}

// installFile copies src to dst unless dst is src itself (noderun install
// run from the installed binary).
func installFile(src, dst string, mode os.FileMode) error {
	if s, err := os.Stat(src); err != nil {
		return err
	} else if d, err := os.Stat(dst); err == nil && os.SameFile(s, d) {
		return os.Chmod(dst, mode)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFile(dst, data, mode)
}

// writeFile replaces path atomically, so a running noderun's binary is
// never written in place (that fails with ETXTBSY) and a crash leaves the
// old file or the new one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	return nil
}

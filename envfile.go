package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// applyEnvFile sets, for every command, the variables of the systemd unit's
// EnvironmentFile (systemd.EnvFile) that the process's environment does not
// set already: reset, images and the client commands run from a shell then
// read the same NODERUN_* settings as the daemon (its cgroup driver, its
// dirs), and the shell's own environment and flags still win. A missing
// file is none, as the unit's "-" says; one this user may not read (mode
// 600, not root) is none too, since only root's commands need the
// daemon's dirs.
func applyEnvFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) || (errors.Is(err, fs.ErrPermission) && os.Geteuid() != 0) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		key, value, ok, err := envLine(sc.Text())
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if _, set := os.LookupEnv(key); ok && !set {
			if err := os.Setenv(key, value); err != nil {
				return fmt.Errorf("%s:%d: %w", path, n, err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// envLine parses one line as systemd reads an EnvironmentFile: blank lines
// and lines starting with # or ; are skipped, KEY=VALUE with the value's
// surrounding quotes (double or single) removed. Hand-written rather than a
// dotenv library: dotenv expands $VAR and takes `export`, systemd does
// neither, and noderun must read the file exactly as systemd does.
func envLine(line string) (key, value string, ok bool, err error) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' || line[0] == ';' {
		return "", "", false, nil
	}
	key, value, found := strings.Cut(line, "=")
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	if !found || key == "" || strings.ContainsAny(key, " \t") {
		return "", "", false, fmt.Errorf("not KEY=VALUE: %q", line)
	}
	if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
		value = value[1 : len(value)-1]
	}
	return key, value, true, nil
}

// childMode reports whether args start one of the hidden modes containerd's
// shim or noderun runs (the log driver, the collector, pause): they take
// no configuration, and a bad line in the file must not fail a container.
func childMode(args []string) bool {
	return len(args) > 1 && (args[1] == "log-driver" || args[1] == "log-collector" || args[1] == "pause")
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/runner/volume"
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

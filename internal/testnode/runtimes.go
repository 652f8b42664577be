package testnode

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

	"golang.org/x/sys/unix"
)

// RuntimeEnv names the containerd and runc pair the tests run:
// NODERUN_TEST_CONTAINERD=1.6|1.7|2.x (see Runtimes; unset is 1.6).
const RuntimeEnv = "NODERUN_TEST_CONTAINERD"

// Runtime is a containerd and runc pair a node under test can run: the
// host's packages, or both built from their Go modules at tagged versions.
type Runtime struct {
	Name       string // RuntimeEnv's value
	Containerd string // module@version, "" for the host's binaries
	Runc       string // module@version
}

// Runtimes are the pairs make test-runtimes runs the e2e core against.
// 1.6 is Debian 12's packages (containerd 1.6.20, runc 1.1.5); the others
// are the newest tags of containerd 1.7 and 2.x the Go module proxy
// serves, with the runc 1.3 that late containerd 1.7 releases ship and the
// newest runc. (runc 1.2.8's go.mod replaces a module with a directory its
// module zip leaves out, so it cannot be built from its module.)
var Runtimes = []Runtime{
	{Name: "1.6"},
	{Name: "1.7", Containerd: "github.com/containerd/containerd@v1.7.35", Runc: "github.com/opencontainers/runc@v1.3.7"},
	{Name: "2.x", Containerd: "github.com/containerd/containerd/v2@v2.4.2", Runc: "github.com/opencontainers/runc@v1.5.3"},
}

// UseRuntime makes the pair RuntimeEnv names the one every containerd the
// tests start runs: it builds the pair into a cache (once; see
// buildRuntime) and puts its directory first on this process's PATH, which
// containerd, its shims and runc inherit. With RuntimeEnv unset or 1.6 it
// changes nothing. It returns the pair.
func UseRuntime(ctx context.Context) (Runtime, error) {
	name := os.Getenv(RuntimeEnv)
	if name == "" {
		name = Runtimes[0].Name
	}
	for _, rt := range Runtimes {
		if rt.Name != name {
			continue
		}
		if rt.Containerd == "" {
			return rt, nil
		}
		dir, err := buildRuntime(ctx, rt)
		if err != nil {
			return rt, fmt.Errorf("%s=%s: %w", RuntimeEnv, name, err)
		}
		return rt, os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	names := make([]string, len(Runtimes))
	for i, rt := range Runtimes {
		names[i] = rt.Name
	}
	return Runtime{}, fmt.Errorf("%s=%q: not one of %s", RuntimeEnv, name, strings.Join(names, ", "))
}

// BuiltRuntime returns the directory holding the pair named name
// (RuntimeEnv's values; not the host's 1.6), building it first unless it
// is cached: make test-vm copies it into its image.
func BuiltRuntime(ctx context.Context, name string) (string, error) {
	for _, rt := range Runtimes {
		if rt.Name == name && rt.Containerd != "" {
			return buildRuntime(ctx, rt)
		}
	}
	return "", fmt.Errorf("no built containerd and runc pair is named %q", name)
}

// runtimeCache is where built pairs are kept: ~/.cache/noderun-test
// (XDG_CACHE_HOME respected), outside any checkout, so that every
// worktree and CI run on the machine shares them.
func runtimeCache() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "noderun-test", "runtimes"), nil
}

// buildRuntime returns the directory holding rt's containerd,
// containerd-shim-runc-v2 and runc, building them first unless a complete
// build is cached. Each module is built as the main module of a copy of
// its own source (go install m@v refuses containerd 1.7, whose go.mod has
// exclude directives), so its go.mod and go.sum pick every dependency as
// its release did. containerd is static (CGO_ENABLED=0; btrfs, which needs
// cgo headers, left out); runc needs cgo and is built with seccomp
// (libseccomp-dev, pkg-config), so seccomp profiles work as with Debian's.
// A lock of the pair's own keeps parallel test processes from building it
// twice.
func buildRuntime(ctx context.Context, rt Runtime) (string, error) {
	cache, err := runtimeCache()
	if err != nil {
		return "", err
	}
	key := strings.NewReplacer("/", "_", "@", "-").Replace(rt.Containerd + "+" + rt.Runc)
	dir := filepath.Join(cache, key)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "runc")); err == nil {
		return dir, nil
	}
	unlock, err := lockBuild(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "runc")); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "bin")
	steps := []struct {
		module string
		cgo    string
		tags   string
		pkgs   map[string]string // output name: package dir in the module
	}{
		{rt.Containerd, "0", "no_btrfs", map[string]string{
			"containerd": "./cmd/containerd", "containerd-shim-runc-v2": "./cmd/containerd-shim-runc-v2"}},
		{rt.Runc, "1", "seccomp", map[string]string{"runc": "."}},
	}
	for _, s := range steps {
		src, err := moduleCopy(ctx, s.module, filepath.Join(tmp, "src"))
		if err != nil {
			return "", err
		}
		for out, pkg := range s.pkgs {
			cmd := exec.CommandContext(ctx, "go", "build", "-mod=mod", "-trimpath", "-tags", s.tags,
				"-o", filepath.Join(bin, out), pkg)
			cmd.Dir = src
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+s.cgo, "GOFLAGS=-mod=mod")
			if b, err := cmd.CombinedOutput(); err != nil {
				return "", fmt.Errorf("build %s of %s (go build -tags %s %s): %w\n%s", out, s.module, s.tags, pkg, err, b)
			}
		}
	}
	if err := os.Rename(bin, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// moduleDir is where the Go module cache holds module's (path@version)
// source, downloaded through the Go module proxy first.
func moduleDir(ctx context.Context, module string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", module).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s%s", err, ee.Stderr, out)
		}
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no source directory in %q (%v)", module, out, err)
	}
	return m.Dir, nil
}

// lockBuild takes the lock of the build that fills dir (dir.lock, an
// exclusive flock), so that parallel test processes build it once; it
// returns the release.
func lockBuild(dir string) (func(), error) {
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return func() { lock.Close() }, nil
}

// moduleCopy downloads module (path@version) through the Go module proxy
// and copies its source under parent, writable, to build it in.
func moduleCopy(ctx context.Context, module, parent string) (string, error) {
	src, err := moduleDir(ctx, module)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(parent, strings.NewReplacer("/", "_", "@", "-").Replace(module))
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return "", err
	}
	// The module cache's files are read-only; go build updates go.sum.
	return dst, filepath.WalkDir(dst, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(path, mode)
	})
}

// RuntimeVersions says which containerd and runc binaries on PATH the
// tests run, as their first version lines say, for the test log.
func RuntimeVersions(ctx context.Context) string {
	var parts []string
	for _, bin := range []string{"containerd", "runc"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			parts = append(parts, bin+": "+err.Error())
			continue
		}
		out, err := exec.CommandContext(ctx, path, "--version").Output()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if err != nil {
			line = err.Error()
		}
		parts = append(parts, path+": "+line)
	}
	return strings.Join(parts, "; ")
}

package testnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// KubeCommands are the programs of k8s.io/kubernetes BuildKube builds
// when it is given none.
var KubeCommands = []string{"kubelet", "kubeadm", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// BuildKube returns a directory holding cmds (KubeCommands when none are
// named) of k8s.io/kubernetes at version (v1.X.Y), building the ones not
// cached yet in ~/.cache/noderun-test/kube/<version> (see kubeCache). The
// module is built as the main module of a copy of its source with its
// staging replaces pinned to the published v0.X.Y modules (see
// pinLocalReplaces), static, with the version stamped as Kubernetes' own
// build does: kubeadm and the API server report it and compare it.
func BuildKube(ctx context.Context, version string, cmds ...string) (string, error) {
	if len(cmds) == 0 {
		cmds = KubeCommands
	}
	m := regexp.MustCompile(`^v1\.(\d+)\.(\d+)$`).FindStringSubmatch(version)
	if m == nil {
		return "", fmt.Errorf("kubernetes version %q: want v1.X.Y", version)
	}
	pkgs := make(map[string]string, len(cmds))
	for _, c := range cmds {
		pkgs[c] = "./cmd/" + c
	}
	var ldflags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		for k, v := range map[string]string{"gitVersion": version, "gitMajor": "1", "gitMinor": m[1],
			"gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z"} {
			ldflags = append(ldflags, "-X", pkg+"."+k+"="+v)
		}
	}
	return buildModule(ctx, moduleBuild{
		module:  "k8s.io/kubernetes@" + version,
		staging: "v0." + m[1] + "." + m[2],
		dir:     version,
		pkgs:    pkgs,
		ldflags: ldflags,
	})
}

// KubeadmEtcdVersion is the etcd version (3.X.Y) kubeadm of the
// Kubernetes version expects for its own minor: its constants'
// SupportedEtcdVersion entry, read from the module source.
func KubeadmEtcdVersion(ctx context.Context, version string) (string, error) {
	dir, err := moduleDir(ctx, "k8s.io/kubernetes@"+version)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cmd/kubeadm/app/constants/constants.go"))
	if err != nil {
		return "", err
	}
	minor := regexp.MustCompile(`^v1\.(\d+)\.`).FindStringSubmatch(version)
	if minor == nil {
		return "", fmt.Errorf("kubernetes version %q: want v1.X.Y", version)
	}
	m := regexp.MustCompile(`(?m)^\s*` + minor[1] + `:\s*"(\d+\.\d+\.\d+)-\d+",`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("kubeadm %s: no etcd version for 1.%s in its SupportedEtcdVersion", version, minor[1])
	}
	return string(m[1]), nil
}

// BuildEtcd returns a directory holding etcd (3.X.Y), built from
// go.etcd.io/etcd/server/v3 as BuildKube builds Kubernetes and cached
// beside it.
func BuildEtcd(ctx context.Context, version string) (string, error) {
	return buildModule(ctx, moduleBuild{
		module: "go.etcd.io/etcd/server/v3@v" + version,
		dir:    "etcd-v" + version,
		pkgs:   map[string]string{"etcd": "."},
	})
}

// moduleBuild is one module's programs to build into the kube cache.
type moduleBuild struct {
	module  string            // path@version
	staging string            // version of modules its go.mod requires at v0.0.0 through a local replace
	dir     string            // directory under the cache
	pkgs    map[string]string // output name: package dir in the module
	ldflags []string
}

// kubeCache is where BuildKube and BuildEtcd keep their builds, beside
// the runtimes' (runtimeCache).
func kubeCache() (string, error) {
	dir, err := runtimeCache()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(dir), "kube"), nil
}

// buildModule builds b's programs that its cache directory lacks. A lock
// of the directory's own keeps parallel test processes from building the
// same programs twice; the builds run at low priority (the machine is
// shared with timing-sensitive tests) and each program is moved into the
// directory only once it is whole.
func buildModule(ctx context.Context, b moduleBuild) (string, error) {
	cache, err := kubeCache()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, b.dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Programs already built need no lock: another process may hold it
	// for hours building others of the same version.
	if len(missingPrograms(dir, b.pkgs)) == 0 {
		return dir, nil
	}
	unlock, err := lockBuild(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	missing := missingPrograms(dir, b.pkgs)
	if len(missing) == 0 {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src, err := moduleCopy(ctx, b.module, filepath.Join(tmp, "src"))
	if err != nil {
		return "", err
	}
	if err := pinLocalReplaces(ctx, src, b.staging); err != nil {
		return "", fmt.Errorf("%s: %w", b.module, err)
	}
	bin := filepath.Join(tmp, "bin")
	args := []string{"-n", "10", "go", "build", "-mod=mod", "-trimpath",
		"-ldflags", strings.Join(append([]string{"-s", "-w"}, b.ldflags...), " "), "-o", bin + "/"}
	for _, out := range missing {
		args = append(args, b.pkgs[out])
	}
	cmd := exec.CommandContext(ctx, "nice", args...)
	cmd.Dir = src
	// Kubernetes' module carries the go.work of its staging tree.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s of %s: %w\n%s", strings.Join(missing, ", "), b.module, err, out)
	}
	for _, out := range missing {
		// go build names a program for its package's last path element,
		// a major version suffix (go.etcd.io/etcd/server/v3) left out.
		name := filepath.Base(b.pkgs[out])
		if b.pkgs[out] == "." {
			module, _, _ := strings.Cut(b.module, "@")
			name = filepath.Base(regexp.MustCompile(`/v\d+$`).ReplaceAllString(module, ""))
		}
		if err := os.Rename(filepath.Join(bin, name), filepath.Join(dir, out)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// missingPrograms are the programs of pkgs that dir lacks.
func missingPrograms(dir string, pkgs map[string]string) []string {
	var missing []string
	for out := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, out)); err != nil {
			missing = append(missing, out)
		}
	}
	return missing
}

// pinLocalReplaces drops the go.mod replaces in src that point at
// directories beside the module (Kubernetes' staging tree, etcd's sibling
// modules): a module's zip leaves those directories out. A requirement
// that only the replace made valid (v0.0.0) is pinned to staging instead.
func pinLocalReplaces(ctx context.Context, src, staging string) error {
	cmd := exec.CommandContext(ctx, "go", "mod", "edit", "-json")
	cmd.Dir = src
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go mod edit -json: %w", err)
	}
	var mod struct {
		Require []struct{ Path, Version string }
		Replace []struct {
			Old struct{ Path string }
			New struct{ Path, Version string }
		}
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return err
	}
	local := map[string]bool{}
	var edits []string
	for _, r := range mod.Replace {
		if strings.HasPrefix(r.New.Path, "./") || strings.HasPrefix(r.New.Path, "../") {
			local[r.Old.Path] = true
			edits = append(edits, "-dropreplace="+r.Old.Path)
		}
	}
	for _, r := range mod.Require {
		if local[r.Path] && r.Version == "v0.0.0" {
			if staging == "" {
				return fmt.Errorf("go.mod requires %s v0.0.0 through a local replace, and no version is given for it", r.Path)
			}
			edits = append(edits, "-require="+r.Path+"@"+staging)
		}
	}
	if len(edits) == 0 {
		return nil
	}
	cmd = exec.CommandContext(ctx, "go", append([]string{"mod", "edit"}, edits...)...)
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go mod edit: %w: %s", err, b)
	}
	return nil
}

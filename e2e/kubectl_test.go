package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// kubectlDir is the module that builds the real kubectl (e2e/kubectl).
const kubectlDir = "kubectl"

var (
	kubectlOnce sync.Once
	kubectlDone = make(chan struct{})
	kubectlBin  string
	kubectlErr  error
)

// startKubectlBuild builds kubectl in the background (setup calls it, so
// the minutes a cold build takes overlap the tests that need no kubectl).
func startKubectlBuild() {
	kubectlOnce.Do(func() {
		go func() {
			defer close(kubectlDone)
			kubectlBin, kubectlErr = compileKubectl(filepath.Join(workDir, "kubectl"))
		}()
	})
}

// buildKubectl returns the path of kubectl built from the k8s.io/kubectl
// module at the version e2e/kubectl/go.mod pins, built once per test
// process.
func buildKubectl(t *testing.T) string {
	t.Helper()
	requireE2E(t)
	startKubectlBuild()
	<-kubectlDone
	if kubectlErr != nil {
		t.Fatal(kubectlErr)
	}
	return kubectlBin
}

func compileKubectl(bin string) (string, error) {
	ver, err := moduleVersion(kubectlDir, "k8s.io/kubectl")
	if err != nil {
		return "", err
	}
	// k8s.io/kubectl v0.X.Y is kubectl v1.X.Y; stamped so that `kubectl
	// version` and its skew check see a real version.
	kv := "v1" + strings.TrimPrefix(ver, "v0")
	ldflags := "-X k8s.io/client-go/pkg/version.gitVersion=" + kv + " -X k8s.io/component-base/version.gitVersion=" + kv
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", bin, ".")
	cmd.Dir = kubectlDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kubectl: %w\n%s", err, out)
	}
	return bin, nil
}

// moduleVersion is the version of module mod in the build list of the
// module in dir.
func moduleVersion(dir, mod string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s in %s: %w", mod, dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// The kubectl the tests run speaks the API version noderun serves: its
// module uses the same k8s.io/api and k8s.io/apimachinery as noderun.
func TestKubectlPinnedWithNoderun(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go in PATH")
	}
	for _, mod := range []string{"k8s.io/api", "k8s.io/apimachinery"} {
		ours, err := moduleVersion("..", mod)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := moduleVersion(kubectlDir, mod)
		if err != nil {
			t.Fatal(err)
		}
		if ours != theirs {
			t.Errorf("%s: noderun uses %s, the tests' kubectl %s", mod, ours, theirs)
		}
	}
}

// kubeconfig writes a kubeconfig for the node's API with `noderun
// kubeconfig` (the view token, or the admin token) and returns its path.
func (n *node) kubeconfig(admin bool) string {
	n.t.Helper()
	path := filepath.Join(n.root, "kubeconfig-view")
	args := []string{"--state-dir", n.state, "--run-dir", n.run, "kubeconfig", "-o"}
	if admin {
		path = filepath.Join(n.root, "kubeconfig-admin")
		args = append(args, path, "--admin")
	} else {
		args = append(args, path)
	}
	if out, err := exec.Command(noderunBin, args...).CombinedOutput(); err != nil {
		n.t.Fatalf("noderun kubeconfig: %v\n%s", err, out)
	}
	return path
}

// kubectl runs the real kubectl against the node with a kubeconfig (from
// n.kubeconfig) and returns its stdout and stderr.
func (n *node) kubectl(kubeconfig string, args ...string) (stdout, stderr string, err error) {
	n.t.Helper()
	buildKubectl(n.t) // before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := n.kubectlCmd(ctx, kubeconfig, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// kubectlCmd is a kubectl command for tests that stream (watch, logs -f,
// exec); nothing of the host's kubectl setup reaches it.
func (n *node) kubectlCmd(ctx context.Context, kubeconfig string, args ...string) *exec.Cmd {
	bin := buildKubectl(n.t)
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig, "--request-timeout", "0"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + n.root, "KUBECACHEDIR=" + filepath.Join(n.root, "kubecache")}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

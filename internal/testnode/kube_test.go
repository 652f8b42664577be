package testnode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// KubeBuildEnv asks TestBuildKube to build every KubeCommands program and
// etcd at the Kubernetes version it names (minutes on a cold cache).
const KubeBuildEnv = "NODERUN_TEST_KUBE_BUILD"

func TestBuildKube(t *testing.T) {
	version := os.Getenv(KubeBuildEnv)
	if version == "" {
		t.Skipf("%s=v1.X.Y builds Kubernetes and etcd from their modules", KubeBuildEnv)
	}
	ctx := context.Background()
	dir, err := BuildKube(ctx, version)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range KubeCommands {
		out, err := exec.CommandContext(ctx, filepath.Join(dir, c), "--version").CombinedOutput()
		if err != nil && c == "kubeadm" {
			out, err = exec.CommandContext(ctx, filepath.Join(dir, c), "version", "-o", "short").CombinedOutput()
		}
		if err != nil || !strings.Contains(string(out), version) {
			t.Errorf("%s --version: %q, %v; want %s", c, out, err, version)
		}
	}
	etcdVersion, err := KubeadmEtcdVersion(ctx, version)
	if err != nil {
		t.Fatal(err)
	}
	edir, err := BuildEtcd(ctx, etcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(edir, "etcd"), "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "etcd Version: "+etcdVersion) {
		t.Errorf("etcd --version: %q, %v; want %s", out, err, etcdVersion)
	}
	t.Logf("kubernetes %s in %s, etcd %s in %s", version, dir, etcdVersion, edir)
}

func TestPinLocalReplaces(t *testing.T) {
	dir := t.TempDir()
	mod := "module example.com/m\n\ngo 1.24\n\nrequire (\n\tk8s.io/api v0.0.0\n\tgo.etcd.io/etcd/api/v3 v3.6.5\n\texample.com/kept v1.0.0\n)\n\n" +
		"replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tgo.etcd.io/etcd/api/v3 => ../api\n\texample.com/kept => example.com/fork v1.0.1\n)\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pinLocalReplaces(context.Background(), dir, "v0.34.2"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	got := string(b)
	for _, want := range []string{"k8s.io/api v0.34.2", "go.etcd.io/etcd/api/v3 v3.6.5", "example.com/kept => example.com/fork v1.0.1"} {
		if !strings.Contains(got, want) {
			t.Errorf("go.mod lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "./staging") || strings.Contains(got, "../api") {
		t.Errorf("go.mod keeps a local replace:\n%s", got)
	}
	if err := pinLocalReplaces(context.Background(), dir, ""); err != nil {
		t.Errorf("second pass: %v", err)
	}
}

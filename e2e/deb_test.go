package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
)

// TestDebPackage installs the package `make deb` built (NODERUN_DEB) with
// apt into a fresh Debian root made by debootstrap, so its dependencies are
// resolved from Debian's archive as on a real machine, checks what it put
// in place, and runs a pod with the installed binary on the suite's
// containerd. It takes minutes, so only `make test-deb` runs it.
func TestDebPackage(t *testing.T) {
	deb := os.Getenv("NODERUN_DEB")
	if deb == "" {
		t.Skip("run by make test-deb, which sets NODERUN_DEB to the package")
	}
	requireE2E(t)
	_, err := exec.LookPath("debootstrap")
	testenv.Require(t, err == nil, "debootstrap in PATH")

	root := debianRoot(t)
	// Maintainer scripts must not start daemons (containerd) in the root.
	writeFile(t, filepath.Join(root, "usr/sbin/policy-rc.d"), "#!/bin/sh\nexit 101\n", 0o755)
	pkgData, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "tmp/noderun.deb"), string(pkgData), 0o644)
	inRoot(t, root, "apt-get", "update", "-qq")
	inRoot(t, root, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "/tmp/noderun.deb")

	status := inRoot(t, root, "dpkg-query", "-W", "-f", "${Package} ${Status}\n",
		"noderun", "containerd", "runc", "containernetworking-plugins", "iptables")
	t.Logf("in the Debian root:\n%s", status)
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if !strings.HasSuffix(sc.Text(), " install ok installed") {
			t.Errorf("package not installed: %s", sc.Text())
		}
	}
	bin := filepath.Join(root, "usr/bin/noderun")
	for path, mode := range map[string]os.FileMode{
		bin: 0o755,
		filepath.Join(root, "lib/systemd/system/noderun.service"):            0o644,
		filepath.Join(root, "etc/noderun/pods"):                              os.ModeDir | 0o755,
		filepath.Join(root, "usr/share/doc/noderun/README.md"):               0o644,
		filepath.Join(root, "usr/share/doc/noderun/docs/operating.md"):       0o644,
		filepath.Join(root, "usr/share/doc/noderun/docs/reference/flags.md"): 0o644,
	} {
		if fi, err := os.Stat(path); err != nil {
			t.Error(err)
		} else if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
		}
	}
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/noderun.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(unit, []byte("\nExecStart=/usr/bin/noderun --manifests /etc/noderun/pods\n")) {
		t.Errorf("the unit does not start the installed binary:\n%s", unit)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "noderun ") {
		t.Fatalf("%s version: %v: %s", bin, err, out)
	}
	t.Logf("%s: %s", bin, bytes.TrimSpace(out))

	n := newNodeOf(t, bin, nil)
	n.writeManifest("web.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '`+untilTerm+`']
`)
	p := n.waitPod("web", "Running", running)
	t.Logf("pod %s/%s %s, run by the installed binary", p.Namespace, p.Name, p.Status.Phase)
}

// debianRoot makes a minimal root of the host's Debian release; it is
// removed at cleanup, after checking that nothing is mounted beneath it.
func debianRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("/var/tmp", "noderun-deb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m := mountsUnder(t, root); len(m) > 0 {
			t.Errorf("mounts left under %s, not removed: %v", root, m)
			return
		}
		os.RemoveAll(root)
	})
	suite := osRelease(t, "VERSION_CODENAME")
	mirror := os.Getenv("NODERUN_DEB_MIRROR")
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	out, err := exec.Command("debootstrap", "--variant=minbase", suite, root, mirror).CombinedOutput()
	if err != nil {
		t.Fatalf("debootstrap %s %s: %v\n%s", suite, mirror, err, out)
	}
	return root
}

// inRoot runs a command chrooted into root and returns its output.
func inRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command("chroot", append([]string{root}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s %s: %v\n%s", root, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func osRelease(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	t.Fatalf("/etc/os-release has no %s", key)
	return ""
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

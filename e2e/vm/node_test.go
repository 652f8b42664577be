package vm

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/internal/testnode"
	"github.com/noderun/noderun/internal/testvm"
)

// Bounds for a TCG machine on a busy 2-core host, where everything runs
// tens of times slower than on KVM: they bound a hang, not the behaviour.
const (
	bootTimeout = 15 * time.Minute
	podTimeout  = 10 * time.Minute
	cmdTimeout  = 20 * time.Minute
)

// The paths of the package as installed and of its node.
const (
	podsDir      = "/etc/noderun/pods"
	statusSocket = "/run/noderun/noderun.sock"
	busyboxImage = "docker.io/library/busybox:1.36"
	// nodeName is the image's hostname; a static pod's name ends with it.
	nodeName = "noderun-vm"
)

var (
	imageOnce sync.Once
	image     *testvm.Image
	imageErr  error
)

// prerequisites are make test-vm's: it sets NODERUN_VM_DEB to the package
// it built and NODERUN_VM_IMAGE to the examples' busybox image. Without
// NODERUN_VM the tests are not selected at all (make test runs ./...).
func prerequisites(t *testing.T) (deb, busybox string) {
	t.Helper()
	if os.Getenv("NODERUN_VM") == "" {
		t.Skip("make test-vm runs these (NODERUN_VM=1)")
	}
	testenv.Require(t, os.Geteuid() == 0, "root (debootstrap)")
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4"} {
		_, err := exec.LookPath(bin)
		testenv.Require(t, err == nil, bin+" on PATH (make test-vm installs it)")
	}
	deb, busybox = os.Getenv("NODERUN_VM_DEB"), os.Getenv("NODERUN_VM_IMAGE")
	_, err := os.Stat(deb)
	testenv.Require(t, deb != "" && err == nil, "NODERUN_VM_DEB, the package (make test-vm builds it)")
	_, err = os.Stat(busybox)
	testenv.Require(t, busybox != "" && err == nil, "NODERUN_VM_IMAGE, the busybox image tarball (make example-image)")
	return deb, busybox
}

// vmImage builds the image once for the test process.
func vmImage(t *testing.T) *testvm.Image {
	t.Helper()
	imageOnce.Do(func() {
		image, imageErr = testvm.Build(context.Background(), filepath.Join("..", ".."))
		if imageErr == nil && image.Built > 0 {
			fmt.Printf("make test-vm: built the image in %s\n", image.Built.Round(time.Second))
		}
	})
	if imageErr != nil {
		t.Fatalf("the VM image: %v", imageErr)
	}
	return image
}

// node is a machine with noderun installed from the package.
type node struct {
	t      *testing.T
	vm     *testvm.VM
	driver string
	status *testnode.StatusClient
	// before is hostState before noderun's first start.
	before string
	// v1 is a machine booted with cgroup v1 (systemd's legacy/hybrid
	// layout) instead of the unified v2.
	v1 bool
}

// bootNode boots a fresh machine, installs the package and starts noderun
// with systemctl, under the given cgroup driver; kernelArgs are added to
// the machine's kernel command line.
func bootNode(t *testing.T, driver string, kernelArgs ...string) *node {
	t.Helper()
	deb, busybox := prerequisites(t)
	img := vmImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	vm, err := img.New(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Close)
	vm.KernelArgs = kernelArgs
	n := &node{t: t, vm: vm, driver: driver, v1: slices.Contains(kernelArgs, cgroupV1)}
	n.status = &testnode.StatusClient{Client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return n.vm.Dial("unix", statusSocket)
		},
	}}}
	start := time.Now()
	if err := vm.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if n.v1 != (strings.TrimSpace(n.sh("stat -fc %T /sys/fs/cgroup")) == "tmpfs") {
		t.Fatalf("the machine booted with %q has /sys/fs/cgroup of type %s", kernelArgs, n.sh("stat -fc %T /sys/fs/cgroup"))
	}
	t.Logf("the machine (%s) answered ssh %s after qemu started", vm.Accel, time.Since(start).Round(time.Second))
	n.install(deb, busybox)
	return n
}

// install puts the package, the driver setting and the busybox image in
// place and starts noderun as the package says to.
func (n *node) install(deb, busybox string) {
	n.t.Helper()
	n.put("/root/noderun.deb", deb, 0o644)
	// apt, offline (nothing to fetch: every dependency is in the image).
	start := time.Now()
	n.sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -q /root/noderun.deb")
	n.t.Logf("apt-get install of the package took %s", time.Since(start).Round(time.Second))
	n.write("/etc/noderun/env", "NODERUN_CGROUP_DRIVER="+n.driver+"\n", 0o600)
	n.put("/var/lib/noderun/images/busybox.tar", busybox, 0o644)
	n.before = n.sh(hostState)
	start = time.Now()
	n.sh("systemctl start noderun")
	if got := strings.TrimSpace(n.sh("systemctl is-active noderun")); got != "active" {
		n.t.Fatalf("noderun after systemctl start: %s", got)
	}
	n.t.Logf("systemctl start noderun took %s", time.Since(start).Round(time.Second))
}

// put copies a host file into the machine.
func (n *node) put(path, hostPath string, mode os.FileMode) {
	n.t.Helper()
	b, err := os.ReadFile(hostPath)
	if err != nil {
		n.t.Fatal(err)
	}
	n.write(path, string(b), mode)
}

func (n *node) write(path, data string, mode os.FileMode) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	if err := n.vm.WriteFile(ctx, path, []byte(data), mode); err != nil {
		n.t.Fatal(err)
	}
}

// sh runs a script in the machine; a failure fails the test.
func (n *node) sh(script string) string {
	n.t.Helper()
	out, err := n.try(script)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

func (n *node) try(script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return n.vm.Run(ctx, script)
}

// apply puts a manifest in the pods dir.
func (n *node) apply(name, manifest string) {
	n.t.Helper()
	n.write(podsDir+"/"+name+".yaml", manifest, 0o644)
}

// waitPods polls the status API until ok holds for its pods and returns
// them, by manifest name; the API not answering (noderun restarting) counts as not yet.
func (n *node) waitPods(what string, ok func(map[string]v1.Pod) bool) map[string]v1.Pod {
	n.t.Helper()
	deadline := time.Now().Add(podTimeout)
	var last error
	var pods map[string]v1.Pod
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		list, _, err := n.status.Pods(ctx)
		cancel()
		last = err
		if err == nil {
			pods = map[string]v1.Pod{}
			for _, p := range list {
				pods[strings.TrimSuffix(p.Name, "-"+nodeName)] = p
			}
			if ok(pods) {
				return pods
			}
		}
		time.Sleep(time.Second) // a poll of the node's records, not a wait for an event
	}
	n.t.Fatalf("%s: not within %s (last error %v); pods:\n%s", what, podTimeout, last, describe(pods))
	return nil
}

// describe is a line per pod: phase and each container's state.
func describe(pods map[string]v1.Pod) string {
	var b strings.Builder
	for name, p := range pods {
		fmt.Fprintf(&b, "  %s: %s", name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " %s restarts=%d %s", cs.Name, cs.RestartCount, stateOf(cs.State))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func stateOf(s v1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Terminated != nil:
		return fmt.Sprintf("terminated(%s, %d)", s.Terminated.Reason, s.Terminated.ExitCode)
	case s.Waiting != nil:
		return "waiting(" + s.Waiting.Reason + ")"
	}
	return "unknown"
}

// running is a waitPods condition: each named pod Running with every
// container running.
func running(names ...string) func(map[string]v1.Pod) bool {
	return func(pods map[string]v1.Pod) bool {
		for _, name := range names {
			p, ok := pods[name]
			if !ok || !testnode.PodRunning(&p) {
				return false
			}
		}
		return true
	}
}

// pid is the PID of the one process in the machine whose command line is
// exactly cmdline (each test pod's is unique).
func (n *node) pid(cmdline string) string {
	n.t.Helper()
	out := strings.Fields(n.sh(fmt.Sprintf("pgrep -x -f %q || true", cmdline)))
	if len(out) != 1 {
		n.t.Fatalf("processes %q: %v, want one", cmdline, out)
	}
	return out[0]
}

// sleepPod is a pod of one container running `sleep <marker>`, with the
// given resources block (YAML under the container, or "").
func sleepPod(name, marker, resources string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: %s
    command: ["sleep", "%s"]
%s`, name, busyboxImage, marker, resources)
}

// hostState is what noderun may change on the machine, for noderun reset
// to restore: its dirs, cgroups, links, rules, mounts, namespaces.
// Counters, the kernel's ordering and which iptables tables are loaded
// (iptables-save lists a table once used) are left out.
const hostState = `echo "== dirs"; ls -A /var/lib/noderun /run/noderun /var/log/pods 2>&1
echo "== cgroups"; find /sys/fs/cgroup -name 'noderun*' -type d | sort
echo "== links"; ip -o link | awk '{print $2}' | sort
echo "== iptables"; iptables-save | grep '^-'
echo "== mounts"; awk '{print $5}' /proc/self/mountinfo | sort
echo "== netns"; ip netns list
echo "== cni"; ls -A /etc/cni/net.d /var/lib/cni 2>&1
echo "== containerd namespaces"; ctr namespaces ls -q
`

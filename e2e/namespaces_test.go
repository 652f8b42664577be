package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/internal/testnode"
	"github.com/noderun/noderun/runner"
)

func hostNS(t *testing.T, kind string) string {
	t.Helper()
	l, err := os.Readlink("/proc/self/ns/" + kind)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// hostPID and hostIPC put the container in the host's namespaces (and its
// /dev/shm); without them each pod has its own.
func TestHostPIDAndHostIPC(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	marker := "noderun-e2e-" + filepath.Base(n.root)
	t.Cleanup(func() { os.Remove("/dev/shm/" + marker) })
	show := `for f in pid ipc; do echo "ns $(readlink /proc/self/ns/$f)"; done;`
	n.writeManifest("host.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: host}
spec:
  terminationGracePeriodSeconds: 2
  hostPID: true
  hostIPC: true
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '%s echo from-pod > /dev/shm/%s; %s']
`, show, marker, untilTerm))
	n.writeManifest("own.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: own}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '%s ls /dev/shm | sed "s/^/shm /"; echo done; %s']
`, show, untilTerm))
	host := n.waitPod("host", "Running", running)
	own := n.waitPod("own", "Running", running)
	hostLog, ownLog := n.logPath(host, "main", 0), n.logPath(own, "main", 0)
	n.waitLogLine(hostLog, "ns "+hostNS(t, "pid"))
	n.waitLogLine(hostLog, "ns "+hostNS(t, "ipc"))
	waitFile(t, "/dev/shm/"+marker, "from-pod\n")
	n.waitLogLine(ownLog, "done")
	for _, l := range n.readLog(ownLog) {
		if l.content == "ns "+hostNS(t, "pid") || l.content == "ns "+hostNS(t, "ipc") || l.content == "shm "+marker {
			t.Errorf("a pod without hostPID/hostIPC sees the host's: %q", l.content)
		}
	}
}

// The containers of one pod share its /dev/shm (64 MiB, as the pause
// container's under CRI); another pod does not see it.
func TestPodSharesDevShm(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("shm.yaml", `apiVersion: v1
kind: Pod
metadata: {name: shm}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: writer
    image: busybox:1.36
    command: ["sh", "-c", 'echo shared > /dev/shm/x; df -k /dev/shm | tail -1 | awk "{print \"size \" \$2}"; `+untilTerm+`']
  - name: reader
    image: busybox:1.36
    command: ["sh", "-c", 'while ! cat /dev/shm/x; do sleep 0.1; done; `+untilTerm+`']
`)
	n.writeManifest("other.yaml", `apiVersion: v1
kind: Pod
metadata: {name: other}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'sleep 2; ls /dev/shm/x 2>&1; `+untilTerm+`']
`)
	p := n.waitPod("shm", "Running", running)
	n.waitLogLine(n.logPath(p, "writer", 0), "size 65536")
	n.waitLogLine(n.logPath(p, "reader", 0), "shared")
	o := n.waitPod("other", "Running", running)
	n.waitLogLine(n.logPath(o, "main", 0), "ls: /dev/shm/x: No such file or directory")
}

func TestSysctls(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	pod := func(name, sysctls string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 2
  securityContext:
    sysctls: %s
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'for f in net/ipv4/ip_local_port_range kernel/shm_rmid_forced kernel/msgmax; do echo "$f=$(cat /proc/sys/$f)"; done; %s']
`, name, sysctls, untilTerm)
	}
	n.writeManifest("safe.yaml", pod("safe", `[{name: net.ipv4.ip_local_port_range, value: "40000 50000"}, {name: kernel.shm_rmid_forced, value: "1"}]`))
	n.writeManifest("unsafe.yaml", pod("unsafe", `[{name: kernel.msgmax, value: "16384"}]`))
	p := n.waitPod("safe", "Running", running)
	n.waitLogLine(n.logPath(p, "main", 0), "net/ipv4/ip_local_port_range=40000\t50000")
	n.waitLogLine(n.logPath(p, "main", 0), "kernel/shm_rmid_forced=1")
	// As the kubelet's sysctl admit handler: the pod is rejected before
	// anything of it runs.
	n.rejected("unsafe", "SysctlForbidden", `forbidden sysctl: "kernel.msgmax" not allowlisted`)

	// A node that allows it runs the pod with the value in its own IPC
	// namespace, leaving the host's alone.
	before, _ := os.ReadFile("/proc/sys/kernel/msgmax")
	n2 := newNode(t, "--allowed-unsafe-sysctls", "kernel.msg*")
	n2.writeManifest("unsafe.yaml", pod("unsafe", `[{name: kernel.msgmax, value: "16384"}]`))
	p2 := n2.waitPod("unsafe", "Running", running)
	n2.waitLogLine(n2.logPath(p2, "main", 0), "kernel/msgmax=16384")
	if after, _ := os.ReadFile("/proc/sys/kernel/msgmax"); string(after) != string(before) {
		t.Errorf("the host's kernel.msgmax changed: %q -> %q", before, after)
	}
}

// HostToContainer: a mount made on the host below a hostPath after the
// container started appears inside it (rslave), as under CRI.
func TestMountPropagationHostToContainer(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	dir := filepath.Join(n.root, "propagated")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.SharedMount(t, dir) // CRI requires the source on a shared (or slave) mount
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	n.writeManifest("prop.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: prop}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: host, hostPath: {path: %s}}]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'echo started; while ! [ -e /host/sub/marker ]; do sleep 0.1; done; echo appeared; %s']
    volumeMounts: [{name: host, mountPath: /host, mountPropagation: HostToContainer}]
`, dir, untilTerm))
	p := n.waitPod("prop", "Running", running)
	n.waitLogLine(n.logPath(p, "main", 0), "started")
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(sub, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitLogLine(n.logPath(p, "main", 0), "appeared")
}

func waitFile(t *testing.T, path, want string) {
	t.Helper()
	for range 300 {
		if b, err := os.ReadFile(path); err == nil && string(b) == want {
			return
		}
		sleepPoll()
	}
	b, err := os.ReadFile(path)
	t.Fatalf("%s = %q, %v; want %q", path, b, err, want)
}

func sleepPoll() { time.Sleep(pollEvery) }

// shareProcessNamespace: the pod's containers see each other's processes,
// PID 1 is the pod's pause process (as the pause container under CRI), and
// nothing of the host is reachable through it; teardown leaves no process.
func TestShareProcessNamespace(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("shared.yaml", `apiVersion: v1
kind: Pod
metadata: {name: shared}
spec:
  terminationGracePeriodSeconds: 2
  shareProcessNamespace: true
  containers:
  - name: sleeper
    image: busybox:1.36
    command: ["sleep", "31337"]
  - name: looker
    image: busybox:1.36
    command: ["sh", "-c", 'until ps -o args | grep -q "^sleep 31337"; do sleep 0.1; done; echo sees-sleeper; tr "\0" " " < /proc/1/cmdline | cut -d" " -f2 | sed "s/^/pid1 /"; ls /proc/1/root/ 2>&1 | head -1 | sed "s/^/root /"; echo done; `+untilTerm+`']
`)
	p := n.waitPod("shared", "Running", running)
	log := n.logPath(p, "looker", 0)
	n.waitLogLine(log, "sees-sleeper")
	n.waitLogLine(log, "pid1 pause")
	n.waitLogLine(log, "done")
	for _, l := range n.readLog(log) {
		if strings.HasPrefix(l.content, "root ") && !strings.Contains(l.content, "Permission denied") {
			t.Errorf("the pause process's root is reachable: %q", l.content)
		}
	}
	pidFile := filepath.Join(n.run, "pods", runner.SandboxID(string(p.UID)), "pause.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("no pause process recorded: %v", err)
	}
	pid := strings.TrimSpace(string(b))
	n.removeManifest("shared.yaml")
	n.waitGone("shared", waitTimeout)
	if _, err := os.Stat("/proc/" + pid + "/ns/pid"); err == nil {
		if cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline"); strings.Contains(string(cmd), "pause") {
			t.Errorf("the pause process %s outlived its pod", pid)
		}
	}
}

// setHostnameAsFQDN with a subdomain: the kernel's hostname, /etc/hostname
// and $HOSTNAME are the FQDN, /etc/hosts keeps "IP FQDN short", as with the
// kubelet and containerd's CRI.
func TestSetHostnameAsFQDN(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("fqdn.yaml", `apiVersion: v1
kind: Pod
metadata: {name: fqdn}
spec:
  terminationGracePeriodSeconds: 2
  hostname: h
  subdomain: s
  setHostnameAsFQDN: true
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'echo "uts $(hostname)"; echo "file $(cat /etc/hostname)"; env | grep ^HOSTNAME= | sed "s/^/env /"; grep -c "h.s.default.svc.cluster.local	h$" /etc/hosts | sed "s/^/hosts /"; `+untilTerm+`']
`)
	p := n.waitPod("fqdn", "Running", running)
	log := n.logPath(p, "main", 0)
	const fqdn = "h.s.default.svc.cluster.local"
	n.waitLogLine(log, "uts "+fqdn)
	n.waitLogLine(log, "file "+fqdn)
	n.waitLogLine(log, "env HOSTNAME="+fqdn)
	n.waitLogLine(log, "hosts 1")
}

// hostnameOverride (GA in v1.37) is the kernel's hostname, /etc/hostname
// and $HOSTNAME in place of hostname and subdomain, and /etc/hosts names the
// pod's IP with it alone (no domain), as the kubelet writes it.
func TestHostnameOverride(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("override.yaml", `apiVersion: v1
kind: Pod
metadata: {name: override}
spec:
  terminationGracePeriodSeconds: 2
  hostname: h
  subdomain: s
  hostnameOverride: node-a.example
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'echo "uts $(hostname)"; echo "file $(cat /etc/hostname)"; env | grep ^HOSTNAME= | sed "s/^/env /"; grep -v "^#" /etc/hosts | grep -v localhost | grep -v ip6- | sed "s/^/hosts /"; `+untilTerm+`']
`)
	p := n.waitPod("override", "Running", running)
	log := n.logPath(p, "main", 0)
	n.waitLogLine(log, "uts node-a.example")
	n.waitLogLine(log, "file node-a.example")
	n.waitLogLine(log, "env HOSTNAME=node-a.example")
	n.waitLogLine(log, "hosts "+p.Status.PodIP+"\tnode-a.example")
	var hosts []string
	for _, l := range n.readLog(log) {
		if strings.HasPrefix(l.content, "hosts ") {
			hosts = append(hosts, l.content)
		}
	}
	if len(hosts) != 1 {
		t.Errorf("/etc/hosts names the pod %d times, want once with the override: %q", len(hosts), hosts)
	}
}

// nsLine waits for the container's line "ns <ipc> <uts> <hostname>".
func (n *node) nsLine(p *v1.Pod, container string, run int) string {
	n.t.Helper()
	path := n.logPath(p, container, run)
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		for _, l := range n.readLog(path) {
			if strings.HasPrefix(l.content, "ns ") {
				return l.content
			}
		}
		time.Sleep(pollEvery)
	}
	n.t.Fatalf("log %s: no ns line after %s", path, waitTimeout)
	return ""
}

// A pod's containers share its ipc and uts namespaces, which are held off
// the host's mount table (only the net pin is there) and outlive noderun: a
// container the next noderun restarts joins the same ones, so its SysV IPC
// objects and hostname are still there, as with CRI's pause container.
func TestPodIPCAndUTSOutliveNoderun(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	show := `echo "ns $(readlink /proc/self/ns/ipc) $(readlink /proc/self/ns/uts) $(hostname)";`
	n.writeManifest("shared.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: shared}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: a
    image: busybox:1.36
    command: ["sh", "-c", '%[1]s %[2]s']
  - name: b
    image: busybox:1.36
    command: ["sh", "-c", '%[1]s %[2]s']
`, show, untilTerm))
	p := n.waitPod("shared", "Running", running)
	a, b := n.nsLine(p, "a", 0), n.nsLine(p, "b", 0)
	if a != b {
		t.Fatalf("the pod's containers are in different namespaces: %q and %q", a, b)
	}
	if strings.Contains(a, hostNS(t, "ipc")) || strings.Contains(a, hostNS(t, "uts")) {
		t.Fatalf("the pod shares the host's ipc or uts namespace: %q", a)
	}
	if !strings.HasSuffix(a, " "+p.Name) {
		t.Errorf("hostname in %q, want %s", a, p.Name)
	}
	sandbox := filepath.Join(n.run, "pods", runner.SandboxID(string(p.UID)))
	want := []string{filepath.Join(sandbox, "net")}
	if pins := nsfsUnder(t, sandbox); !slices.Equal(pins, want) {
		t.Errorf("namespace pins on the host for the pod: %v, want %v", pins, want)
	}

	if held := n.heldSandboxes(); !slices.Contains(held, runner.SandboxID(string(p.UID))) {
		t.Errorf("the pod's namespaces are not in noderun's holder (it holds %v)", held)
	}

	n.kill9()
	n.start()
	n.waitHealthy()
	if err := unix.Kill(n.mainPID(p, "b"), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.waitPod("shared", "b restarted", func(p *v1.Pod) bool { return running(p) && containerStatus(p, "b").RestartCount == 1 })
	if again := n.nsLine(p, "b", 1); again != a {
		t.Errorf("after a noderun restart, the restarted container is in %q, want the pod's %q", again, a)
	}
}

// nsfsUnder lists the namespace pins at or below dir in the host's mount
// table.
func nsfsUnder(t *testing.T, dir string) []string {
	t.Helper()
	return hostMounts(t, dir, func(m testnode.Mount) bool { return m.FSType == "nsfs" })
}

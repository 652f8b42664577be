package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner"
)

// waitingReason returns a container's waiting reason and message.
func waitingReason(p *v1.Pod, container string) (string, string) {
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if cs.Name == container && cs.State.Waiting != nil {
			return cs.State.Waiting.Reason, cs.State.Waiting.Message
		}
	}
	return "", ""
}

// An init container plants links in a shared emptyDir; the app containers
// mount subPaths through them. Before the fix, runc bind-mounted the host's
// / into "root" and noderun created a directory on the host for "hostdir".
func TestSubPathThroughPlantedLinkRefused(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	hostSide := filepath.Join(n.root, "host-side")
	if err := os.Mkdir(hostSide, 0o755); err != nil {
		t.Fatal(err)
	}
	n.writeManifest("planted.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: planted
spec:
  terminationGracePeriodSeconds: 2
  volumes:
  - name: data
    emptyDir: {}
  initContainers:
  - name: plant
    image: busybox:1.36
    command: ["sh", "-c", "ln -s / /data/cfg && ln -s %s /data/a && mkdir /data/ok"]
    volumeMounts: [{name: data, mountPath: /data}]
  containers:
  - name: root
    image: busybox:1.36
    command: ["sh", "-c", 'ls /cfg/etc/passwd && echo ESCAPED; %s']
    volumeMounts: [{name: data, mountPath: /cfg, subPath: cfg}]
  - name: hostdir
    image: busybox:1.36
    command: ["sh", "-c", 'echo ESCAPED; %s']
    volumeMounts: [{name: data, mountPath: /b, subPath: a/b}]
  - name: fine
    image: busybox:1.36
    command: ["sh", "-c", 'echo inside > /ok/x && echo fine-ran; %s']
    volumeMounts: [{name: data, mountPath: /ok, subPath: ok}]
`, hostSide, untilTerm, untilTerm, untilTerm))
	p := n.waitPod("planted", "both subPath containers refused", func(p *v1.Pod) bool {
		r1, _ := waitingReason(p, "root")
		r2, _ := waitingReason(p, "hostdir")
		return r1 == "CreateContainerConfigError" && r2 == "CreateContainerConfigError"
	})
	for c, sub := range map[string]string{"root": "cfg", "hostdir": "a/b"} {
		_, msg := waitingReason(p, c)
		if !strings.Contains(msg, fmt.Sprintf("subPath %q", sub)) || !strings.Contains(msg, "outside the volume") {
			t.Errorf("%s: message %q does not name subPath %q as escaping", c, msg, sub)
		}
		if lines := n.readLog(n.logPath(p, c, 0)); len(lines) > 0 {
			t.Errorf("%s ran: %v", c, lines)
		}
	}
	if _, err := os.Lstat(filepath.Join(hostSide, "b")); !os.IsNotExist(err) {
		t.Errorf("noderun created %s through the planted link: %v", filepath.Join(hostSide, "b"), err)
	}
	// A subPath that stays inside the volume still works.
	n.waitLogLine(n.logPath(p, "fine", 0), "fine-ran")
	b, err := os.ReadFile(filepath.Join(n.state, "pods", string(p.UID), "volumes", "empty-dir", "data", "ok", "x"))
	if err != nil || string(b) != "inside\n" {
		t.Errorf("file written through the subPath = %q, %v", b, err)
	}
}

// downwardAPI volumes are read-only inside, and noderun rewriting them
// never writes through links found in the volume directory.
func TestDownwardAPIVolumeReadOnlyAndAtomic(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("dapi.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: dapi
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
  - name: podinfo
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'cat /etc/podinfo/labels; touch /etc/podinfo/x 2>&1; ln -sf /etc/shadow /etc/podinfo/labels 2>&1; `+untilTerm+`']
    volumeMounts: [{name: podinfo, mountPath: /etc/podinfo}]
`)
	p := n.waitPod("dapi", "Running", running)
	log := n.logPath(p, "main", 0)
	n.waitLogLine(log, `app="web"`)
	n.waitLogLine(log, "touch: /etc/podinfo/x: Read-only file system")

	// What a container could do while the volume was writable (before this
	// fix, or with a state dir from then): every entry a link to a host file.
	dir := filepath.Join(n.state, "pods", string(p.UID), "volumes", "downward-api", "podinfo")
	shadow := filepath.Join(n.root, "shadow")
	if err := os.WriteFile(shadow, []byte("root:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gen, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatalf("no ..data link in %s: %v", dir, err)
	}
	for _, name := range []string{"labels", gen + "/labels"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(shadow, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A restarted noderun sets the sandbox up again and rewrites the volume.
	n.stop()
	n.start()
	n.waitHealthy()
	deadline := time.Now().Add(waitTimeout)
	for {
		if target, _ := os.Readlink(filepath.Join(dir, "labels")); target == "..data/labels" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("noderun did not republish %s/labels after the restart", dir)
		}
		time.Sleep(pollEvery)
	}
	b, err := os.ReadFile(shadow)
	fi, _ := os.Stat(shadow)
	if err != nil || string(b) != "root:secret\n" || fi.Mode().Perm() != 0o600 {
		t.Errorf("host file behind the planted link = %q mode %v, want it untouched", b, fi.Mode().Perm())
	}
	if b, err := os.ReadFile(filepath.Join(dir, "labels")); err != nil || string(b) != "app=\"web\"\n" {
		t.Errorf("republished labels = %q, %v", b, err)
	}
}

// A metadata.uid that is not one safe path component is refused, and the
// pods next to it (their state, their emptyDir data) survive everything.
func TestUnsafeUIDRefused(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("keep.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: keep
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'echo kept > /data/f; `+untilTerm+`']
    volumeMounts: [{name: data, mountPath: /data}]
`)
	keep := n.waitPod("keep", "Running", running)
	kept := filepath.Join(n.state, "pods", string(keep.UID), "volumes", "empty-dir", "data", "f")
	for i, uid := range []string{"..", "team/app", "../../.."} {
		n.writeManifest(fmt.Sprintf("bad%d.yaml", i), fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: bad%d, uid: %q}
spec: {terminationGracePeriodSeconds: 1, containers: [{name: c, image: busybox:1.36, command: [sleep, "3600"]}]}
`, i, uid))
	}
	n.waitOutput(regexp.MustCompile(`bad2\.yaml:[\d:]+: metadata\.uid: `))
	for i := range 3 {
		n.removeManifest(fmt.Sprintf("bad%d.yaml", i))
	}
	n.stop()
	n.start()
	n.waitHealthy()
	time.Sleep(time.Second) // orphan removal runs once the sources settle
	for _, p := range n.pods() {
		if strings.HasPrefix(p.Name, "bad") {
			t.Errorf("pod %s with an unsafe uid runs (uid %q)", p.Name, p.UID)
		}
	}
	again := n.waitPod("keep", "Running", running)
	if containerID(again.Status.ContainerStatuses[0]) != containerID(keep.Status.ContainerStatuses[0]) {
		t.Errorf("keep's container changed: %s -> %s", containerID(keep.Status.ContainerStatuses[0]), containerID(again.Status.ContainerStatuses[0]))
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "kept\n" {
		t.Errorf("keep's emptyDir file = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(n.state, "pods", string(keep.UID), "pod.json")); err != nil {
		t.Errorf("keep's pod.json: %v", err)
	}
}

// fsGroup owns emptyDirs (setgid, group-writable), so what a non-root
// container creates there is uid:fsGroup; a memory emptyDir has its size.
func TestFSGroupOwnsEmptyDir(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("fsgroup.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: fsgroup
spec:
  terminationGracePeriodSeconds: 2
  securityContext: {runAsUser: 1000, fsGroup: 2000}
  volumes:
  - {name: data, emptyDir: {}}
  - {name: mem, emptyDir: {medium: Memory, sizeLimit: 16Mi}}
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'touch /data/f; stat -c "file %u:%g" /data/f; stat -c "dir %u:%g %a" /data; df -k /mem | tail -1 | awk "{print \"mem \" \$2}"; `+untilTerm+`']
    volumeMounts: [{name: data, mountPath: /data}, {name: mem, mountPath: /mem}]
`)
	p := n.waitPod("fsgroup", "Running", running)
	log := n.logPath(p, "main", 0)
	// What a kubelet with containerd gives: the file is the user's with the
	// fsGroup (setgid directory), the directory root:fsGroup drwxrwsrwx.
	n.waitLogLine(log, "file 1000:2000")
	n.waitLogLine(log, "dir 0:2000 2777")
	n.waitLogLine(log, "mem 16384")
}

// subPathExpr expands the container's env, then is resolved like subPath.
func TestSubPathExpr(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("expr.yaml", `apiVersion: v1
kind: Pod
metadata: {name: expr}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: main
    image: busybox:1.36
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    command: ["sh", "-c", 'echo mine > /logs/f && echo written; `+untilTerm+`']
    volumeMounts: [{name: data, mountPath: /logs, subPathExpr: 'pods/$(POD_NAME)'}]
`)
	p := n.waitPod("expr", "Running", running)
	n.waitLogLine(n.logPath(p, "main", 0), "written")
	f := filepath.Join(n.state, "pods", string(p.UID), "volumes", "empty-dir", "data", "pods", "expr-e2e", "f")
	if b, err := os.ReadFile(f); err != nil || string(b) != "mine\n" {
		t.Errorf("%s = %q, %v", f, b, err)
	}
}

// A container writing without end into its /etc/hosts or its termination
// message file fills the pod's own small tmpfs and gets ENOSPC; the bytes
// never reach the host's /run (the run dir) or /var/lib (the state dir).
func TestPodFilesCannotFillTheHost(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	const fill = 64 << 20 // far beyond the pod's tmpfs
	for _, f := range []struct{ name, path string }{{"hosts", "/etc/hosts"}, {"msg", "/dev/termination-log"}} {
		n.writeManifest(f.name+".yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "head -c %d /dev/zero | tr '\\0' a >> %s && exit 0; exit 7"]
`, f.name, fill, f.path))
	}
	for _, name := range []string{"hosts", "msg"} {
		p := n.waitPodFor(name, "Failed", 2*time.Minute, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
		term := containerStatus(p, "main").State.Terminated
		if term == nil || term.ExitCode != 7 {
			t.Fatalf("%s: %s; want exit 7 (the write failed)", name, statusJSON(p))
		}
		if name == "msg" && term.Message != strings.Repeat("a", 4096) {
			t.Errorf("msg: message %q…, want the file's last 4096 bytes", abbrev(term.Message))
		}
		if name == "hosts" {
			var logged []string
			for _, l := range n.readLog(n.logPath(p, "main", 0)) {
				logged = append(logged, l.content)
			}
			if !strings.Contains(strings.Join(logged, "\n"), "No space left on device") {
				t.Errorf("hosts: log %q; want ENOSPC", logged)
			}
		}
		dir := filepath.Join(n.run, "pods", runner.SandboxID(string(p.UID)), "files")
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			t.Fatalf("%s: %s: statfs %v type %#x; want the pod's tmpfs", name, dir, err, st.Type)
		}
		if size := int64(st.Blocks) * int64(st.Bsize); size > 2<<20 {
			t.Errorf("%s: the pod's tmpfs is %d bytes; want about 1 MiB", name, size)
		}
	}
	var used int64
	for _, root := range []string{n.run, n.state} {
		filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && !strings.Contains(path, "/files/") {
				used += fi.Size()
			}
			return nil
		})
	}
	if used > fill/2 {
		t.Errorf("run and state dirs hold %d bytes outside the pods' tmpfs", used)
	}
}

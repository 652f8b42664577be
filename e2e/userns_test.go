package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testnode"
)

// usernsPod is a pod in a user namespace of its own. Its app container,
// with /proc unmasked, prints its ID map, who it is, how its rootfs and its
// emptyDir and hostPath volumes' files look to it and which of /proc is
// masked; its again container prints its map and exits (to be restarted)
// when /scratch/exit appears.
func usernsPod(name, hostDir string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 2
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: host, hostPath: {path: ` + hostDir + `, type: Directory}}
  containers:
  - name: app
    image: busybox:1.36
    securityContext: {procMount: Unmasked}
    volumeMounts: [{name: scratch, mountPath: /scratch}, {name: host, mountPath: /host}]
    command: ["sh", "-c", 'echo "map $(cat /proc/self/uid_map | tr -s " " | sed "s/^ //")"; echo "id $(id -u):$(id -g)";
      echo "rootfs $(stat -c %u:%g /etc/passwd)"; touch /new && echo "rootfs new $(stat -c %u:%g /new)";
      touch /scratch/f && echo "emptyDir $(stat -c %u:%g /scratch/f)";
      echo "hostPath $(stat -c %u:%g /host/byroot) $(stat -c %u:%g /host/by1000)"; touch /host/fromct;
      [ "$(awk "\$5 ~ \"^/proc/\"" /proc/self/mountinfo | wc -l)" = 0 ] && echo "proc unmasked" || echo "proc masked"; ` + untilTerm + `']
  - name: again
    image: busybox:1.36
    volumeMounts: [{name: scratch, mountPath: /scratch}]
    command: ["sh", "-c", 'echo "map $(cat /proc/self/uid_map | tr -s " " | sed "s/^ //")"; [ "$(awk "\$5 ~ \"^/proc/\"" /proc/self/mountinfo | wc -l)" = 0 ] && echo "proc unmasked" || echo "proc masked";
      until [ -e /scratch/exit ]; do sleep 0.2; done; rm /scratch/exit; exit 1']
`
}

// hostUsers: false runs where the runtime can (the 2.x pair: containerd 2,
// runc 1.2 or later with idmapped mounts): each pod gets 65536 IDs of its
// own, root in it is an unprivileged ID on the host, its rootfs and
// volumes are idmapped so that files root owns on the host are root's in
// the pod, two pods' ranges are disjoint and a restart of noderun keeps a
// pod's. Elsewhere (Debian's containerd 1.6 and runc 1.1, containerd 1.7)
// the pod is rejected with the kubelet's message. procMount Unmasked works
// with it and is refused without.
func TestUserNamespaces(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	hostDir := filepath.Join(n.root, "userns-host")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for file, uid := range map[string]int{"byroot": 0, "by1000": 1000} {
		path := filepath.Join(hostDir, file)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	// procMount Unmasked needs hostUsers: false, as the API server says.
	masked := filepath.Join(n.root, "unmasked.yaml")
	if err := os.WriteFile(masked, []byte(strings.Replace(usernsPod("unmasked", hostDir), "  hostUsers: false\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(noderunBin, "check", masked).CombinedOutput()
	if want := "spec.containers[0].securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("noderun check of procMount Unmasked without hostUsers: false: %v\n%s\nwant %q", err, out, want)
	}

	n.writeManifest("userns.yaml", usernsPod("userns", hostDir))
	if rt := os.Getenv(testnode.RuntimeEnv); rt != "2.x" {
		n.rejected("userns", "UserNamespacesUnsupported", "can't set `spec.hostUsers: false`, runtime does not support user namespaces")
		return
	}
	p := n.waitPod("userns", "Running", running)
	host := n.usernsRange(p)
	if host < 65536 || host%65536 != 0 {
		t.Fatalf("the pod's range starts at %d, want a multiple of 65536 from 65536", host)
	}
	mapLine := fmt.Sprintf("map 0 %d 65536", host)
	app := n.logPath(p, "app", 0)
	for _, want := range []string{mapLine, "id 0:0", "rootfs 0:0", "rootfs new 0:0", "emptyDir 0:0", "hostPath 0:0 1000:1000", "proc unmasked"} {
		n.waitLogLine(app, want)
	}
	n.waitLogLine(n.logPath(p, "again", 0), mapLine)
	n.waitLogLine(n.logPath(p, "again", 0), "proc masked") // procMount Default

	// The host's view: the container's root is the range's first ID, and
	// what it wrote through the idmapped volumes is root's on the host.
	pid := n.task(containerID(*namedStatus(p, "app"))).Pid
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", host, host, host, host); !strings.Contains(string(status), want+"\n") {
		t.Errorf("the container's root as the host sees it: want %q in\n%s", want, status)
	}
	for _, f := range []string{filepath.Join(hostDir, "fromct"), n.emptyDirFile(p, "scratch", "f")} {
		if got := ownerOf(t, f); got != "0:0" {
			t.Errorf("%s, written by the container's root, is %s on the host, want 0:0", f, got)
		}
	}

	// A second pod's range is another.
	n.writeManifest("userns2.yaml", usernsPod("userns2", hostDir))
	p2 := n.waitPod("userns2", "Running", running)
	if other := n.usernsRange(p2); other == host || other < 65536 || other%65536 != 0 {
		t.Errorf("the second pod's range starts at %d, the first's at %d: want disjoint multiples of 65536", other, host)
	}

	// A restart keeps the pod's range: its again container, restarted
	// after noderun's own restart, has the same map.
	n.stop()
	n.start()
	if err := os.WriteFile(n.emptyDirFile(p, "scratch", "exit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitPod("userns", "again restarted", func(p *v1.Pod) bool {
		cs := namedStatus(p, "again")
		return cs != nil && cs.RestartCount == 1 && cs.State.Running != nil
	})
	n.waitLogLine(n.logPath(p, "again", 1), mapLine)
}

// usernsRange reads the pod's range from its userns file, in the kubelet's
// format, and checks it against what the kernel says of its app container.
func (n *node) usernsRange(p *v1.Pod) uint32 {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.state, "pods", string(p.UID), "userns"))
	if err != nil {
		n.t.Fatal(err)
	}
	var host, length uint32
	if _, err := fmt.Sscanf(string(b), `{"uidMappings":[{"hostId":%d,"containerId":0,"length":%d}]`, &host, &length); err != nil || length != 65536 {
		n.t.Fatalf("userns file %s: %v", b, err)
	}
	pid := n.task(containerID(*namedStatus(p, "app"))).Pid
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		n.t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(string(m)), " "); got != fmt.Sprintf("0 %d 65536", host) {
		n.t.Errorf("uid_map of %s's app container: %q, want its userns file's range from %d", p.Name, got, host)
	}
	return host
}

// emptyDirFile is a file of the pod's emptyDir as the host has it.
func (n *node) emptyDirFile(p *v1.Pod, volume, file string) string {
	return filepath.Join(n.state, "pods", string(p.UID), "volumes", "empty-dir", volume, file)
}

func ownerOf(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("stat", "-c", "%u:%g", path).Output()
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

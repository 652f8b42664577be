package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
)

// printIDs prints what the process is, as the kernel sees it, on one line.
const printIDs = `echo uid=$(id -u) gid=$(id -g) groups=$(grep Groups /proc/self/status | cut -f2)`

// addUsersImages imports two busybox images whose /etc/passwd and
// /etc/group define app (uid 1000, group 1000, member of staff=50 and
// extra=3000): users:1 runs as "app", users:group as "app:staff".
func (n *node) addUsersImages() {
	n.t.Helper()
	var imgs []ociimage.Image
	for name, user := range map[string]string{"docker.io/library/users:1": "app", "docker.io/library/users:group": "app:staff"} {
		img, err := ociimage.Busybox(name)
		if err != nil {
			n.t.Fatal(err)
		}
		img.Files["/etc/passwd"] = ociimage.Regular([]byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home:/bin/sh\n"), 0o644)
		img.Files["/etc/group"] = ociimage.Regular([]byte("root:x:0:\nstaff:x:50:app\napp:x:1000:\nextra:x:3000:nobody,app\n"), 0o644)
		img.User = user
		imgs = append(imgs, img)
	}
	if err := ociimage.WriteFile(filepath.Join(n.images, "users.tar"), imgs...); err != nil {
		n.t.Fatal(err)
	}
	// noderun imports tarballs added to its images dir; wait for that, so
	// the pods below never see a missing image.
	deadline := time.Now().Add(waitTimeout)
	for _, img := range imgs {
		for {
			_, err := client.ImageService().Get(n.ctx(), img.Name)
			if err == nil {
				break
			}
			if !errdefs.IsNotFound(err) || time.Now().After(deadline) {
				n.t.Fatalf("image %s not imported: %v", img.Name, err)
			}
			time.Sleep(pollEvery)
		}
	}
}

func namedStatus(p *v1.Pod, name string) *v1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func namedWaitReason(p *v1.Pod, name string) string {
	if cs := namedStatus(p, name); cs != nil && cs.State.Waiting != nil {
		return cs.State.Waiting.Reason
	}
	return ""
}

// TestRunAsNonRoot: the kubelet refuses, before creating anything, a
// container that would run as root or as a user it cannot check, with a
// CreateContainerConfigError; runAsUser 1000 runs as 1000.
func TestRunAsNonRoot(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.addUsersImages()
	n.writeManifest("nonroot.yaml", `apiVersion: v1
kind: Pod
metadata: {name: nonroot}
spec:
  terminationGracePeriodSeconds: 5
  securityContext: {runAsNonRoot: true}
  containers:
  - name: root
    image: busybox:1.36
    command: ["sh", "-c", 'echo ran; `+untilTerm+`']
  - name: named
    image: users:1
    command: ["sh", "-c", 'echo ran; `+untilTerm+`']
  - name: uid
    image: busybox:1.36
    securityContext: {runAsUser: 1000}
    command: ["sh", "-c", '`+printIDs+`; `+untilTerm+`']
`)
	p := n.waitPod("nonroot", "uid running, root and named refused", func(p *v1.Pod) bool {
		cs := namedStatus(p, "uid")
		return cs != nil && cs.State.Running != nil &&
			namedWaitReason(p, "root") == "CreateContainerConfigError" && namedWaitReason(p, "named") == "CreateContainerConfigError"
	})
	ref := fmt.Sprintf(`(pod: "nonroot-e2e_default(%s)", container: %%s)`, p.UID)
	for name, want := range map[string]string{
		"root":  "container has runAsNonRoot and image will run as root " + fmt.Sprintf(ref, "root"),
		"named": "container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root " + fmt.Sprintf(ref, "named"),
	} {
		if got := namedStatus(p, name).State.Waiting.Message; got != want {
			t.Errorf("container %s: message\n %q\nwant %q", name, got, want)
		}
		if _, err := os.Stat(n.logPath(p, name, 0)); !os.IsNotExist(err) {
			t.Errorf("container %s has a log (err %v): it must never have run", name, err)
		}
	}
	n.waitLogLine(n.logPath(p, "uid", 0), "uid=1000 gid=0 groups=0")
	if cons := n.containers(string(p.UID)); len(cons) != 1 || cons[0].ID != containerID(*namedStatus(p, "uid")) {
		t.Errorf("containerd holds %d containers for the pod, want only the uid one", len(cons))
	}
}

// TestImageUserAndGroups: names resolve in the image's /etc/passwd and
// /etc/group; the image's ":group" is dropped as the kubelet drops it;
// runAsGroup, fsGroup and supplementalGroups apply; supplementalGroupsPolicy
// Strict leaves out the image's groups.
func TestImageUserAndGroups(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.addUsersImages()
	pod := func(name, policy string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 5
  securityContext: {fsGroup: 2000, supplementalGroups: [4000], supplementalGroupsPolicy: ` + policy + `}
  containers:
  - name: named
    image: users:1
    command: ["sh", "-c", '` + printIDs + `; ` + untilTerm + `']
  - name: withgroup
    image: users:group
    command: ["sh", "-c", '` + printIDs + `; ` + untilTerm + `']
  - name: runas
    image: users:1
    securityContext: {runAsUser: 1000, runAsGroup: 2500}
    command: ["sh", "-c", '` + printIDs + `; ` + untilTerm + `']
`
	}
	n.writeManifest("merge.yaml", pod("merge", "Merge"))
	n.writeManifest("strict.yaml", pod("strict", "Strict"))
	// What a kubelet with containerd's CRI gives: the image's groups that
	// list app (50, 3000) only under Merge; fsGroup 2000 and
	// supplementalGroups 4000 always; the primary group is in the list.
	wants := map[string]map[string]string{
		"merge": {
			"named":     "uid=1000 gid=1000 groups=50 1000 2000 3000 4000",
			"withgroup": "uid=1000 gid=1000 groups=50 1000 2000 3000 4000",
			"runas":     "uid=1000 gid=2500 groups=50 2000 2500 3000 4000",
		},
		"strict": {
			"named":     "uid=1000 gid=1000 groups=1000 2000 4000",
			"withgroup": "uid=1000 gid=1000 groups=1000 2000 4000",
			"runas":     "uid=1000 gid=2500 groups=2000 2500 4000",
		},
	}
	for pod, want := range wants {
		p := n.waitPod(pod, "Running", running)
		for c, line := range want {
			n.waitLogLine(n.logPath(p, c, 0), line)
		}
	}
	// status user.linux says what the process is, as the log does, also
	// once a restarted noderun has adopted the containers.
	for _, restart := range []bool{false, true} {
		if restart {
			n.stop()
			n.start()
		}
		for pod, want := range wants {
			p := n.waitPod(pod, "Running", running)
			for c, line := range want {
				cs := namedStatus(p, c)
				if cs.User == nil || cs.User.Linux == nil {
					t.Fatalf("pod %s container %s (restart %t): no status user", pod, c, restart)
				}
				u := cs.User.Linux
				if got := fmt.Sprintf("uid=%d gid=%d groups=%s", u.UID, u.GID, strings.Trim(fmt.Sprint(u.SupplementalGroups), "[]")); got != line {
					t.Errorf("pod %s container %s (restart %t): status user %s, want %s", pod, c, restart, got, line)
				}
			}
		}
	}
}

// TestHostnameEnv: HOSTNAME is the pod's hostname, or the node's for a
// hostNetwork pod, as with containerd's CRI.
func TestHostnameEnv(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for name, hostNetwork := range map[string]bool{"podnet": false, "hostnet": true} {
		n.writeManifest(name+".yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  hostNetwork: %t
  restartPolicy: Never
  containers:
  - name: main
    image: busybox:1.36
    command: ["env"]
`, name, hostNetwork))
	}
	// env, not a shell: busybox sh sets HOSTNAME itself when it is missing.
	for name, want := range map[string]string{"podnet": "HOSTNAME=podnet-e2e", "hostnet": "HOSTNAME=" + host} {
		p := n.waitPod(name, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
		n.waitLogLine(n.logPath(p, "main", 0), want)
	}
}

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/snapshots"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
	ctrdrt "github.com/noderun/noderun/runner/containerd"
)

// imageVolumeManifest: main mounts the image volume tools whole and its
// data/sub through a subPath, and the volume gc; main reports what it can
// do there, then sleeps. missing mounts an image that is not there.
const imageVolumeManifest = `apiVersion: v1
kind: Pod
metadata:
  name: iv
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command:
    - sh
    - -c
    - |
      cat /tools/data/hello.txt /inner/inner.txt /gc/data/hello.txt
      touch /tools/x 2>&1 || echo write refused
      /tools/bin/busybox echo exec from the volume works
      awk '$5 == "/tools" { print "options", $6 }' /proc/self/mountinfo
      echo done
      exec sleep 3600
    volumeMounts:
    - {name: tools, mountPath: /tools}
    - {name: tools, mountPath: /inner, subPath: data/sub}
    - {name: gc, mountPath: /gc}
  - name: missing
    image: busybox:1.36
    command: [sleep, "3600"]
    volumeMounts: [{name: gone, mountPath: /gone}]
  volumes:
  - {name: tools, image: {reference: "example.com/tools:1", pullPolicy: Never}}
  - {name: gc, image: {reference: "example.com/gc:1"}}
  - {name: gone, image: {reference: "example.com/missing:1", pullPolicy: Never}}
`

// toolsImage is busybox with data/hello.txt and data/sub/inner.txt.
func toolsImage(t *testing.T, name, hello string) string {
	t.Helper()
	img, err := ociimage.Busybox(name)
	if err != nil {
		t.Fatal(err)
	}
	img.Files["/data/hello.txt"] = ociimage.Regular([]byte(hello+"\n"), 0o644)
	img.Files["/data/sub/inner.txt"] = ociimage.Regular([]byte("inner of "+name+"\n"), 0o644)
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteFile(path, img); err != nil {
		t.Fatal(err)
	}
	return path
}

// imageVolumeSnapshots are the node's image volume snapshots of pod uid.
func (n *node) imageVolumeSnapshots(uid string) []snapshots.Info {
	var out []snapshots.Info
	for _, s := range n.snapshots() {
		if s.Labels[ctrdrt.LabelImageVolumePod] == uid {
			out = append(out, s)
		}
	}
	return out
}

// TestImageVolume: image volumes on containerd and runc, offline (the
// image from the images dir, pullPolicy Never): the container reads the
// image's files, whole and through a subPath, cannot write there, and may
// run its binaries (neither the kubelet nor containerd mounts noexec); a
// missing image holds back only the container that mounts it, with the
// kubelet's reason; image GC keeps an image a running pod mounts while it
// removes an unused one; noderun's restart adopts the pod and its mount,
// and a pod removed while noderun was down leaves no snapshot, mount or
// directory once it is back.
func TestImageVolume(t *testing.T) {
	t.Parallel()
	// High threshold 1 %: every GC period finds the disk full, and removes
	// every image unused for 15 s.
	n := newNodeWithImages(t, []string{toolsImage(t, "example.com/tools:1", "hello from tools")},
		"--image-gc-period", "1s", "--image-minimum-gc-age", "15s",
		"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0")
	waitImage(t, n, "example.com/tools:1")
	w := watchLeaks(n, client)
	// What the test adds goes by the end: gc:1 and spare:1 to the GC.
	baseline := w.state()
	// gc:1 and spare:1 are not in the images dir, which would keep them;
	// gc:1 is named by the manifest well within the minimum age.
	for _, name := range []string{"example.com/spare:1", "example.com/gc:1"} {
		if _, err := ctrdrt.ImportArchive(n.ctx(), client, toolsImage(t, name, "hello from "+name), snapshotter); err != nil {
			t.Fatal(err)
		}
	}
	n.writeManifest("iv.yaml", imageVolumeManifest)

	p := n.waitPod("iv", "main running, missing waiting for its image", func(p *v1.Pod) bool {
		cs := namedStatus(p, "main")
		return cs != nil && cs.State.Running != nil && namedWaitReason(p, "missing") == "ErrImageNeverPull"
	})
	if msg := namedStatus(p, "missing").State.Waiting.Message; msg != `Container image "example.com/missing:1" is not present with pull policy of Never` {
		t.Errorf("missing's waiting message %q, want the kubelet's", msg)
	}
	log := n.logPath(p, "main", 0)
	n.waitLogLine(log, "done")
	var lines []string
	for _, l := range n.readLog(log) {
		lines = append(lines, l.content)
	}
	want := []string{"hello from tools", "inner of example.com/tools:1", "hello from example.com/gc:1",
		"touch: /tools/x: Read-only file system", "write refused", "exec from the volume works"}
	if len(lines) < len(want)+2 || !slices.Equal(lines[:len(want)], want) {
		t.Fatalf("main printed %q, want %q, the mount's options, done", lines, want)
	}
	opts := lines[len(want)]
	if !strings.HasPrefix(opts, "options ro") || strings.Contains(opts, "noexec") {
		t.Errorf("/tools is mounted with %q, want ro and no noexec, as containerd mounts it", opts)
	}
	snaps := n.imageVolumeSnapshots(string(p.UID))
	if len(snaps) != 2 || snaps[0].Kind != snapshots.KindView || snaps[1].Kind != snapshots.KindView {
		t.Errorf("image volume snapshots %+v, want 2 views (tools and gc)", snaps)
	}

	// spare:1 goes; gc:1, mounted, stays.
	waitUntilFor(t, "GC removes the unused spare:1", 2*time.Minute, func() bool {
		_, err := client.GetImage(n.ctx(), "example.com/spare:1")
		return errdefs.IsNotFound(err)
	})
	if _, err := client.GetImage(n.ctx(), "example.com/gc:1"); err != nil {
		t.Errorf("GC removed example.com/gc:1, which a running pod mounts: %v", err)
	}

	// A restart adopts the pod: the same run, the same snapshots.
	n.stop()
	n.start()
	n.waitPod("iv", "adopted", func(p *v1.Pod) bool {
		cs := namedStatus(p, "main")
		return cs != nil && cs.State.Running != nil && cs.RestartCount == 0
	})
	if got := n.imageVolumeSnapshots(string(p.UID)); len(got) != 2 {
		t.Errorf("%d image volume snapshots after the restart, want the same 2", len(got))
	}

	// Removed while noderun is down: at its start the pod is an orphan,
	// removed with its image volumes.
	n.kill9()
	n.removeManifest("iv.yaml")
	n.start()
	n.waitGone("iv", time.Minute)
	if left := w.waitNoLeaks(baseline, time.Minute); len(left) > 0 {
		t.Errorf("left after the pod's removal: %v", left)
	}
	if got := n.imageVolumeSnapshots(string(p.UID)); len(got) != 0 {
		t.Errorf("image volume snapshots left: %+v", got)
	}
	if m := mountsUnder(t, filepath.Join(n.state, "pods")); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
}

// waitImage waits for an images-dir tarball's image to be imported and
// unpacked, its layers' snapshots made.
func waitImage(t *testing.T, n *node, name string) {
	t.Helper()
	waitUntil(t, name+" imported", func() bool {
		img, err := client.GetImage(n.ctx(), name)
		if err != nil {
			return false
		}
		ok, _ := img.IsUnpacked(n.ctx(), snapshotter)
		return ok
	})
}

// TestImageVolumeThroughMirror: an image volume's image is pulled as a
// container image is, through a hosts.toml mirror, with the kubelet's
// Pulling and Pulled events naming the pod; once the registry is gone, an
// Always image volume mounts the local copy with a PullFallbackLocal
// warning.
func TestImageVolumeThroughMirror(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	reg := startRegistry(t)
	reg.push(t, reg.addr+"/library/tools:mirrored")
	n.mirrorDockerIO(reg)
	pod := func(name, policy string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: [sh, -c, "/tools/bin/busybox echo mounted; exec sleep 3600"]
    volumeMounts: [{name: tools, mountPath: /tools}]
  volumes:
  - {name: tools, image: {reference: "tools:mirrored", pullPolicy: %s}}
`, name, policy)
	}

	n.writeManifest("a.yaml", pod("a", "IfNotPresent"))
	a := n.waitPod("a", "running (its volume pulled through the mirror)", running)
	n.waitLogLine(n.logPath(a, "main", 0), "mounted")
	evs := n.events("a")
	if !hasEvent(evs, "Pulling", `Pulling image "tools:mirrored"`) || !hasEvent(evs, "Pulled", `Successfully pulled image "tools:mirrored"`) {
		t.Errorf("events: %+v", evs)
	}
	for _, ev := range evs {
		if ev.Reason == "Pulling" && ev.InvolvedObject.FieldPath != "" {
			t.Errorf("the volume's Pulling event names %s, not the pod", ev.InvolvedObject.FieldPath)
		}
	}

	reg.stop()
	n.writeManifest("b.yaml", pod("b", "Always"))
	n.waitPod("b", "running on the local copy", running)
	if !hasEvent(n.events("b"), "PullFallbackLocal", "registry unreachable, running the local copy of docker.io/library/tools:mirrored") {
		t.Errorf("no PullFallbackLocal warning: %+v", n.events("b"))
	}
}

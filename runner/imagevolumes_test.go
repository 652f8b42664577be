package runner

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// imageVolumePod has its main mount the image volume tools (subPath sub at
// /sub too) and other mount nothing.
func imageVolumePod(uid, subPath string) *v1.Pod {
	p := testPod(uid, "iv"+uid, v1.RestartPolicyAlways)
	p.Spec.Volumes = []v1.Volume{{Name: "tools", VolumeSource: v1.VolumeSource{
		Image: &v1.ImageVolumeSource{Reference: "tools:1", PullPolicy: v1.PullIfNotPresent}}}}
	main := &p.Spec.Containers[0]
	main.VolumeMounts = []v1.VolumeMount{{Name: "tools", MountPath: "/tools"}}
	if subPath != "" {
		main.VolumeMounts = append(main.VolumeMounts, v1.VolumeMount{Name: "tools", MountPath: "/sub", SubPath: subPath})
	}
	p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "other", Image: "busybox:1.36"})
	return p
}

func (f *engineFixture) waiting(uid, name string) *v1.ContainerStateWaiting {
	p := f.status(uid)
	if p == nil {
		return nil
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name {
			return cs.State.Waiting
		}
	}
	return nil
}

func (f *engineFixture) imageVolumeCalls() []string {
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	return slices.Clone(f.rt.imageVolumeCalls)
}

// The image is mounted once for the pod and bound read-only, a subPath
// into it too; the pod's removal removes the snapshot.
func TestEngineImageVolumeMountedReadOnly(t *testing.T) {
	f := startEngine(t)
	f.send(imageVolumePod("u1", "sub"))
	waitFor(t, "main's start", func() bool { return f.startedConfig("main", 0) != nil })
	var got []string
	for _, m := range f.startedConfig("main", 0).Mounts {
		if m.Destination == "/tools" || m.Destination == "/sub" {
			got = append(got, m.Destination)
			if !m.ReadOnly {
				t.Errorf("%s is mounted read-write", m.Destination)
			}
		}
		if m.Destination == "/tools" && !strings.HasSuffix(m.Source, filepath.Join("volumes", "image", "tools:1")) {
			t.Errorf("/tools comes from %s, not the image's mount", m.Source)
		}
	}
	if !slices.Equal(got, []string{"/tools", "/sub"}) {
		t.Errorf("image volume mounts %v, want /tools and /sub", got)
	}
	waitFor(t, "other's start", func() bool { return f.startedConfig("other", 0) != nil })
	f.send()
	waitFor(t, "the pod's removal", func() bool { return f.status("u1") == nil })
	want := []string{"mount u1 tools:1", "remove-image-volumes u1"}
	if calls := f.imageVolumeCalls(); !slices.Equal(calls, want) {
		t.Errorf("image volume calls %q, want %q", calls, want)
	}
}

// A volume's image that cannot be pulled holds back only the containers
// mounting it, with the kubelet's reasons: ErrImagePull, then
// ImagePullBackOff; the events name the pod, as the kubelet's do.
func TestEngineImageVolumePullFailure(t *testing.T) {
	f := startEngine(t)
	f.rt.mu.Lock()
	f.rt.imageErrOf = map[string]error{"tools:1": errors.New("ErrImagePull: not found")}
	f.rt.mu.Unlock()
	f.send(imageVolumePod("u1", ""))
	waitFor(t, "other's start", func() bool { return f.startedConfig("other", 0) != nil })
	waitFor(t, "ErrImagePull", func() bool {
		w := f.waiting("u1", "main")
		return w != nil && w.Reason == "ErrImagePull" && w.Message == "ErrImagePull: not found"
	})
	for _, ev := range f.e.Events() {
		if ev.Reason == "Failed" && ev.InvolvedObject.FieldPath != "" {
			t.Errorf("the pull's event names %s, not the pod", ev.InvolvedObject.FieldPath)
		}
	}
	if !f.hasEvent("Failed", `Failed to pull image "tools:1": ErrImagePull: not found`) {
		t.Error("no Failed event for the volume's pull")
	}
	waitFor(t, "the retry's timer", func() bool { return f.clock.timerIn(time.Second) })
	f.clock.Advance(time.Second)
	waitFor(t, "ImagePullBackOff", func() bool {
		w := f.waiting("u1", "main")
		return w != nil && w.Reason == "ImagePullBackOff" && w.Message == `Back-off pulling image "tools:1"`
	})
	if f.startedConfig("main", 0) != nil {
		t.Error("main started without its image volume")
	}
}

// A subPath into an image volume must be a directory, as containerd
// requires; else the start fails as containerd's CreateContainer does.
func TestEngineImageVolumeSubPathMustBeADirectory(t *testing.T) {
	f := startEngine(t)
	f.send(imageVolumePod("u1", "file"))
	waitFor(t, "CreateContainerError", func() bool {
		w := f.waiting("u1", "main")
		return w != nil && w.Reason == "CreateContainerError" &&
			strings.Contains(w.Message, `image volume mount failed: failed to ensure image subpath "file": only directory subpath is supported`)
	})
	f.send(imageVolumePod("u1", "file"), imageVolumePod("u2", "missing"))
	waitFor(t, "CreateContainerError for a missing subPath", func() bool {
		w := f.waiting("u2", "main")
		return w != nil && w.Reason == "CreateContainerError" && strings.Contains(w.Message, `failed to ensure image subpath "missing": openat missing: no such file or directory`)
	})
}

// A new version whose image volume names another image pulls it while the
// old version runs, as for a container's image; its start pulls no more.
func TestEngineUpdatePullsImageVolumeAhead(t *testing.T) {
	f := startEngine(t)
	withTools := func(uid, ref string) *v1.Pod {
		p := versionPod(uid, "app:1")
		p.Spec.Volumes = []v1.Volume{{Name: "tools", VolumeSource: v1.VolumeSource{
			Image: &v1.ImageVolumeSource{Reference: ref, PullPolicy: v1.PullAlways}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "tools", MountPath: "/tools"}}
		return p
	}
	f.send(withTools("v1", "tools:1"))
	waitFor(t, "v1 start", func() bool { return f.rt.startedPod("v1") })
	gate := f.gatePull("tools:2")
	f.send(withTools("v2", "tools:2"))
	waitFor(t, "the pull ahead", func() bool {
		return f.hasPodEvent2("v1", reasonUpdatePulling, `Pulling image "tools:2" for the pod's new version (uid v2)`)
	})
	if f.stoppedAny("v1") || f.rt.startedPod("v2") {
		t.Fatal("the old version stopped before the new one's image volume was pulled")
	}
	ensures := f.ensureCount()
	close(gate)
	waitFor(t, "v2 start", func() bool { return f.rt.startedPod("v2") })
	// The pulls ahead were app:1 (policy Always) and tools:2, both
	// counted by now; the start pulled neither again.
	if got := f.ensureCount(); got != ensures {
		t.Errorf("the new version's start checked %d images again; want it to use the pulls ahead", got-ensures)
	}
	if calls := f.imageVolumeCalls(); !slices.Contains(calls, "mount v2 tools:2") {
		t.Errorf("image volume calls %q: tools:2 not mounted for v2", calls)
	}
}

// An image missing under pullPolicy Never is the kubelet's ErrImageNeverPull,
// in its words, at every look (10 s apart, its pod worker's backoff): no
// pull, so no ImagePullBackOff.
func TestEngineImageVolumeNeverPulled(t *testing.T) {
	f := startEngine(t)
	f.rt.mu.Lock()
	f.rt.imageErrOf = map[string]error{"tools:1": fmt.Errorf("%w: tools:1 is not present", ErrImageNeverPull)}
	f.rt.mu.Unlock()
	p := imageVolumePod("u1", "")
	p.Spec.Volumes[0].Image.PullPolicy = v1.PullNever
	f.send(p)
	const msg = `Container image "tools:1" is not present with pull policy of Never`
	neverPull := func() bool {
		w := f.waiting("u1", "main")
		return w != nil && w.Reason == "ErrImageNeverPull" && w.Message == msg
	}
	waitFor(t, "ErrImageNeverPull", neverPull)
	if !f.hasPodEvent("u1", "ErrImageNeverPull", msg) {
		t.Errorf("no ErrImageNeverPull warning: %+v", f.e.Events())
	}
	checks := func() int {
		f.rt.mu.Lock()
		defer f.rt.mu.Unlock()
		return f.rt.neverChecks
	}
	before := checks()
	waitFor(t, "the next look's timer", func() bool { return f.clock.timerIn(neverPullRetry) })
	f.clock.Advance(neverPullRetry)
	waitFor(t, "the next look", func() bool { return checks() > before })
	if !neverPull() {
		t.Errorf("after the next look main waits with %+v, want ErrImageNeverPull again", f.waiting("u1", "main"))
	}
}

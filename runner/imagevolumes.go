package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Image volumes (KEP-4639, GA in v1.36) as the kubelet v1.37 and
// containerd's CRI plugin make them: before a container starts, the image
// of each image volume it mounts is pulled per the volume's pullPolicy,
// with the container image's events, backoff and waiting reasons (the
// kubelet's getImageVolumes and toKubeContainerImageVolumes); the image's
// root filesystem is then mounted from a snapshot of its own, one per pod
// and image, and bound into the container read-only. Neither the kubelet
// nor containerd adds noexec, so neither does noderun. A subPath must name
// a directory of the image, as containerd's ensureImageSubPath requires.

// errImageVolumeMount marks an image volume the runtime could not mount:
// the kubelet reports it as CreateContainerError, containerd's
// CreateContainer having failed.
var errImageVolumeMount = errors.New("image volume mount failed")

// imageVolumesDir is where a pod's image volumes are mounted, one
// directory per image.
func imageVolumesDir(podDir string) string {
	return filepath.Join(podDir, "volumes", "image")
}

// volumePull is the pull of image volume v, keyed apart from the
// containers' names; its events name the pod.
func volumePull(v v1.Volume) pullRequest {
	return pullRequest{ref: v.Image.Reference, policy: v.Image.PullPolicy, key: "volume:" + v.Name}
}

// imageVolumes pulls and mounts the image volumes c mounts. When one
// cannot be had, c waits with the kubelet's reason, ok is false and retry
// says when to try again.
func (w *podWorker) imageVolumes(ctx context.Context, pod *v1.Pod, c *v1.Container, init bool) (retry time.Duration, ok bool) {
	for _, v := range mountedImageVolumes(pod, c) {
		p := volumePull(v)
		p.init = init
		if _, ok := w.st.pulledAhead[p.key]; ok {
			// Pulled ahead while the old version ran (update.go).
			delete(w.st.pulledAhead, p.key)
		} else if _, retry, ok := w.pullImage(ctx, pod, c, p); !ok {
			return retry, false
		}
		delete(w.st.backoff, "pull:"+p.key)
		delete(w.st.pullUntil, p.key)
		dir, err := w.env.rt.MountImageVolume(ctx, string(pod.UID), p.ref, imageVolumesDir(w.podStateDir()))
		if err != nil {
			err = fmt.Errorf("%w: volume %q: %w", errImageVolumeMount, v.Name, err)
			return w.startFailed(pod, c, "CreateContainerError", err), false
		}
		if w.st.imageVolumes == nil {
			w.st.imageVolumes = map[string]string{}
		}
		w.st.imageVolumes[v.Name] = dir
	}
	return 0, true
}

// mountedImageVolumes are the image volumes c mounts, each once, in the
// order of its volumeMounts.
func mountedImageVolumes(pod *v1.Pod, c *v1.Container) []v1.Volume {
	var out []v1.Volume
	seen := map[string]bool{}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.Image != nil && !seen[v.Name] {
				seen[v.Name] = true
				out = append(out, v)
			}
		}
	}
	return out
}

// imageSubPath checks an image volume's subPath as containerd's
// ensureImageSubPath does (os.Stat through os.OpenInRoot, so no link leads
// out of the image) before it is pinned: it must be a directory.
func imageSubPath(root, subPath string) error {
	fi, err := statInRoot(root, subPath)
	if err == nil && !fi.IsDir() {
		err = errors.New("only directory subpath is supported")
	}
	if err != nil {
		return fmt.Errorf("%w: failed to ensure image subpath %q: %w", errImageVolumeMount, subPath, err)
	}
	return nil
}

func statInRoot(root, name string) (os.FileInfo, error) {
	f, err := os.OpenInRoot(root, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Stat()
}

package runner

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/expansion"
	"github.com/noderun/noderun/runner/volume"
)

func emptyDirPath(podDir, name string) string {
	return filepath.Join(podDir, "volumes", "empty-dir", name)
}

// EmptyDirPath is where a pod's emptyDir volume is under the state dir,
// for the usage endpoints.
func EmptyDirPath(stateDir, podUID, name string) string {
	return emptyDirPath(podStateDir(stateDir, podUID), name)
}

func downwardAPIPath(podDir, name string) string {
	return filepath.Join(podDir, "volumes", "downward-api", name)
}

// setupVolumes creates emptyDirs (tmpfs for medium Memory), checks or
// creates hostPaths per their type and writes downwardAPI, configMap,
// secret and projected files, giving emptyDir and the API-data volumes to
// the pod's fsGroup. Repeating it is harmless.
func (w *podWorker) setupVolumes(pod *v1.Pod) error {
	podDir := w.podStateDir()
	for _, v := range pod.Spec.Volumes {
		var err error
		switch {
		case v.EmptyDir != nil:
			dir := emptyDirPath(podDir, v.Name)
			err = volume.SetupEmptyDir(dir, v.EmptyDir)
			if err == nil {
				err = volume.ApplyFSGroup(dir, pod.Spec.SecurityContext)
			}
		case v.HostPath != nil:
			err = volume.SetupHostPath(v.HostPath)
		case v.DownwardAPI != nil:
			err = w.writeDownwardAPI(downwardAPIPath(podDir, v.Name), pod, v.DownwardAPI)
		case isConfigVolume(v):
			if err = w.writeConfigVolume(pod, v); err != nil {
				return err // already the kubelet's FailedMount text
			}
		case v.Image != nil:
			// Pulled and mounted before each container that mounts it
			// starts (imagevolumes.go), as the kubelet does.
		default:
			err = errors.New("unsupported volume type")
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return nil
}

// writeDownwardAPI publishes one file per item with the kubelet's atomic
// writer; the volume is mounted read-only, as Kubernetes mounts it.
func (w *podWorker) writeDownwardAPI(dir string, pod *v1.Pod, src *v1.DownwardAPIVolumeSource) error {
	mode := uint32(0o644)
	if src.DefaultMode != nil {
		mode = uint32(*src.DefaultMode)
	}
	payload, err := w.downwardPayload(pod, src.Items, mode, podFSGroup(pod))
	if err != nil {
		return err
	}
	return volume.WritePayload(dir, payload, podFSGroup(pod))
}

// downwardPayload renders downwardAPI items, each with its mode or mode.
func (w *podWorker) downwardPayload(pod *v1.Pod, items []v1.DownwardAPIVolumeFile, mode uint32, gid int) (map[string]volume.PayloadFile, error) {
	payload := map[string]volume.PayloadFile{}
	for _, item := range items {
		var val string
		var err error
		switch {
		case item.FieldRef != nil:
			val, err = downwardFieldFile(pod, item.FieldRef.FieldPath, w.st.ips, w.env.cfg.HostIP)
		case item.ResourceFieldRef != nil:
			val, err = resourceFieldValue(pod, nil, item.ResourceFieldRef)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", item.Path, err)
		}
		m := mode
		if item.Mode != nil {
			m = uint32(*item.Mode)
		}
		payload[filepath.Clean(item.Path)] = volume.PayloadFile{Data: []byte(val), Mode: fsGroupMode(m, gid)}
	}
	return payload, nil
}

// fsGroupMode is a file's mode in an API-data volume: with an fsGroup, the
// owner and the group may read it, as the kubelet's SetVolumeOwnership
// gives a read-only volume's files (its roMask).
func fsGroupMode(m uint32, gid int) uint32 {
	if gid != -1 {
		m |= 0o440
	}
	return m & 0o7777
}

// podFSGroup is the pod's fsGroup, -1 without one.
func podFSGroup(pod *v1.Pod) int {
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		return int(*sc.FSGroup)
	}
	return -1
}

// downwardFieldFile renders metadata.labels and metadata.annotations as
// key="value" lines, as the kubelet does; other fields as their value.
func downwardFieldFile(pod *v1.Pod, path string, ips []string, hostIP string) (string, error) {
	var m map[string]string
	switch path {
	case "metadata.labels":
		m = pod.Labels
	case "metadata.annotations":
		m = pod.Annotations
	default:
		return fieldRefValue(pod, path, ips, hostIP)
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String(), nil
}

// containerMounts resolves volumeMounts (with subPath, or subPathExpr
// expanded from the container's env) plus the pod files.
// downwardAPI, configMap, secret, projected and image volumes are always
// read-only, as in Kubernetes.
func (w *podWorker) containerMounts(pod *v1.Pod, c *v1.Container, env []envVar) ([]Mount, error) {
	out := w.podFileMounts(pod, c)
	for i, m := range c.VolumeMounts {
		var src string
		readOnly, image := m.ReadOnly, false
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.EmptyDir != nil:
				src = emptyDirPath(w.podStateDir(), v.Name)
			case v.HostPath != nil:
				src = v.HostPath.Path
			case v.DownwardAPI != nil:
				src, readOnly = downwardAPIPath(w.podStateDir(), v.Name), true
			case isConfigVolume(v):
				src, readOnly = configVolumePath(w.podStateDir(), v), true
			case v.Image != nil:
				src, readOnly, image = w.st.imageVolumes[v.Name], true, true
			}
		}
		if src == "" {
			return nil, fmt.Errorf("volumeMount %q: no such volume", m.Name)
		}
		if m.SubPathExpr != "" {
			m.SubPath = subPathExpr(m.SubPathExpr, env)
		}
		if m.SubPath != "" && image {
			if err := imageSubPath(src, m.SubPath); err != nil {
				return nil, err
			}
		}
		if m.SubPath != "" {
			target := filepath.Join(w.podStateDir(), "volume-subpaths", m.Name, c.Name, strconv.Itoa(i))
			if err := volume.PinSubPath(src, m.SubPath, target); err != nil {
				return nil, fmt.Errorf("volumeMount %q: subPath %q: %w", m.Name, m.SubPath, err)
			}
			src = target
		}
		rro, err := recursiveReadOnly(m, w.env.cfg.RecursiveReadOnlyMounts)
		if err != nil {
			return nil, err
		}
		out = append(out, Mount{Source: src, Destination: m.MountPath, ReadOnly: readOnly, Propagation: propagation(m), RecursiveReadOnly: rro})
	}
	return out, nil
}

// recursiveReadOnly resolves a volumeMount's recursiveReadOnly as the
// kubelet v1.37 does (resolveRecursiveReadOnly), with its errors: Enabled
// where the runtime cannot is an error, IfPossible falls back to a plain
// read-only mount.
func recursiveReadOnly(m v1.VolumeMount, supported bool) (bool, error) {
	if m.RecursiveReadOnly == nil || *m.RecursiveReadOnly == v1.RecursiveReadOnlyDisabled {
		return false, nil
	}
	if !m.ReadOnly {
		return false, fmt.Errorf("volume %q requested recursive read-only mode, but it is not read-only", m.Name)
	}
	if m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone {
		return false, fmt.Errorf("volume %q requested recursive read-only mode, but it is not compatible with propagation %q", m.Name, *m.MountPropagation)
	}
	switch *m.RecursiveReadOnly {
	case v1.RecursiveReadOnlyIfPossible:
		return supported, nil
	case v1.RecursiveReadOnlyEnabled:
		if !supported {
			return false, fmt.Errorf("volume %q requested recursive read-only mode, but it is not supported by the runtime", m.Name)
		}
		return true, nil
	}
	return false, fmt.Errorf("unknown recursive read-only mode %q", *m.RecursiveReadOnly)
}

// subPathExpr expands $(VAR) from the container's env, as the kubelet
// does; the result is checked like any subPath.
func subPathExpr(expr string, env []envVar) string {
	vars := map[string]string{}
	for _, e := range env {
		vars[e.name] = e.value
	}
	return expansion.Expand(expr, func(n string) (string, bool) { v, ok := vars[n]; return v, ok })
}

func propagation(m v1.VolumeMount) v1.MountPropagationMode {
	if m.MountPropagation == nil {
		return v1.MountPropagationNone
	}
	return *m.MountPropagation
}

// memTotal is the node's memory in bytes, from /proc/meminfo.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

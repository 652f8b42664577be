package runner

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner/volume"
)

// configMap, secret and projected volumes (--local-config-objects): the
// kubelet's payloads, written with its atomic writer (..data swap), so a
// changed document updates running pods' files and readers see the old
// set or the new, never a mix. Secret and projected volumes are on a tmpfs
// of their own, as the kubelet puts them, so no secret reaches a disk.

func isConfigVolume(v v1.Volume) bool {
	return v.ConfigMap != nil || v.Secret != nil || v.Projected != nil
}

func configVolumePath(podDir string, v v1.Volume) string {
	kind := "configmap"
	switch {
	case v.Secret != nil:
		kind = "secret"
	case v.Projected != nil:
		kind = "projected"
	}
	return filepath.Join(podDir, "volumes", kind, v.Name)
}

// failedMount is a volume that could not be set up, in the words of the
// kubelet's FailedMount event.
type failedMount struct {
	volume string
	err    error
}

func (e *failedMount) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", e.volume, e.err)
}

func (e *failedMount) Unwrap() error { return e.err }

// writeConfigVolume publishes one configMap, secret or projected volume.
// A missing object or key (not optional) leaves what the volume had.
func (w *podWorker) writeConfigVolume(pod *v1.Pod, v v1.Volume) error {
	payload, err := w.configPayload(pod, v)
	if err != nil {
		return &failedMount{v.Name, err}
	}
	dir := configVolumePath(w.podStateDir(), v)
	if v.Secret != nil || v.Projected != nil {
		if err := volume.SetupTmpfs(dir, w.env.cfg.PodTmpfs); err != nil {
			return &failedMount{v.Name, err}
		}
	}
	if err := volume.WritePayload(dir, payload, podFSGroup(pod)); err != nil {
		return &failedMount{v.Name, err}
	}
	return nil
}

// configPayload is the volume's files: relative path -> content and mode.
func (w *podWorker) configPayload(pod *v1.Pod, v v1.Volume) (map[string]volume.PayloadFile, error) {
	objs, gid := w.env.objects, podFSGroup(pod)
	switch {
	case v.ConfigMap != nil:
		src := v.ConfigMap
		data, err := configMapData(objs, pod.Namespace, src.Name, src.Optional)
		if err != nil {
			return nil, err
		}
		return keyPayload(data, src.Items, mode(src.DefaultMode), gid, optional(src.Optional), "configmap references non-existent config key: %s")
	case v.Secret != nil:
		src := v.Secret
		data, err := secretData(objs, pod.Namespace, src.SecretName, src.Optional)
		if err != nil {
			return nil, err
		}
		return keyPayload(data, src.Items, mode(src.DefaultMode), gid, optional(src.Optional), "references non-existent secret key: %s")
	}
	return w.projectedPayload(pod, v.Projected, gid)
}

// projectedPayload joins the sources' files; each source's errors are
// collected, as the kubelet's projected volume does.
func (w *podWorker) projectedPayload(pod *v1.Pod, p *v1.ProjectedVolumeSource, gid int) (map[string]volume.PayloadFile, error) {
	out := map[string]volume.PayloadFile{}
	var errs []error
	for _, s := range p.Sources {
		var part map[string]volume.PayloadFile
		var err error
		switch {
		case s.ConfigMap != nil:
			var data map[string][]byte
			if data, err = configMapData(w.env.objects, pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Optional); err == nil {
				part, err = keyPayload(data, s.ConfigMap.Items, mode(p.DefaultMode), gid, optional(s.ConfigMap.Optional), "configmap references non-existent config key: %s")
			}
		case s.Secret != nil:
			var data map[string][]byte
			if data, err = secretData(w.env.objects, pod.Namespace, s.Secret.Name, s.Secret.Optional); err == nil {
				part, err = keyPayload(data, s.Secret.Items, mode(p.DefaultMode), gid, optional(s.Secret.Optional), "references non-existent secret key: %s")
			}
		case s.DownwardAPI != nil:
			part, err = w.downwardPayload(pod, s.DownwardAPI.Items, mode(p.DefaultMode), gid)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for k, f := range part {
			out[k] = f
		}
	}
	switch len(errs) {
	case 0:
		return out, nil
	case 1:
		return nil, errs[0]
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return nil, errors.New("[" + strings.Join(msgs, ", ") + "]") // the kubelet's aggregate error
}

// configMapData is a ConfigMap's data and binaryData as files' contents;
// a missing optional one is empty.
func configMapData(objs *configObjects, namespace, name string, opt *bool) (map[string][]byte, error) {
	cm, err := objs.configMap(namespace, name)
	if err != nil {
		return nil, skipOptional(err, opt)
	}
	out := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out, nil
}

func secretData(objs *configObjects, namespace, name string, opt *bool) (map[string][]byte, error) {
	s, err := objs.secret(namespace, name)
	if err != nil {
		return nil, skipOptional(err, opt)
	}
	return s.Data, nil
}

// keyPayload maps keys to files as the kubelet's MakePayload does: every
// key under its own name without items, else the listed keys at their
// paths (a missing one an error unless the source is optional).
func keyPayload(data map[string][]byte, items []v1.KeyToPath, def uint32, gid int, opt bool, missing string) (map[string]volume.PayloadFile, error) {
	out := map[string]volume.PayloadFile{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = volume.PayloadFile{Data: v, Mode: fsGroupMode(def, gid)}
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if opt {
				continue
			}
			return nil, fmt.Errorf(missing, it.Key)
		}
		m := def
		if it.Mode != nil {
			m = uint32(*it.Mode)
		}
		out[filepath.Clean(it.Path)] = volume.PayloadFile{Data: v, Mode: fsGroupMode(m, gid)}
	}
	return out, nil
}

// mode is a defaultMode as defaulted (0644 when unset).
func mode(p *int32) uint32 {
	if p == nil {
		return 0o644
	}
	return uint32(*p)
}

// refreshConfigVolumes rewrites a running pod's configMap, secret and
// projected volumes when the objects changed since they were written, as
// the kubelet's periodic remount does; a failure is a FailedMount event
// and the files stay as they were.
func (w *podWorker) refreshConfigVolumes(pod *v1.Pod) {
	rev := w.env.objects.revision()
	if rev == w.st.configRev {
		return
	}
	ok := true
	for _, v := range pod.Spec.Volumes {
		if !isConfigVolume(v) {
			continue
		}
		if err := w.writeConfigVolume(pod, v); err != nil {
			ok = false
			w.event(pod, "", false, v1.EventTypeWarning, "FailedMount", err.Error())
		}
	}
	if ok {
		w.st.configRev = rev
	}
}

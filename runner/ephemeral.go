package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/manifests"
)

// Ephemeral containers (kubectl debug) are the pod's by its UID, not its
// manifest's: they are kept in the pod's state dir (ephemeral.json) so a
// restarted noderun adopts them with the pod, as the kubelet keeps them
// while the pod lives; they go with the pod (a changed manifest is a new
// UID) and are never written to the manifest. Each is started once and
// never restarted.

// ErrPodNotFound: no pod of that namespace and name runs on this node.
var ErrPodNotFound = errors.New("pod not found")

// InvalidError lists why an update of a pod's ephemeral containers was
// refused; each is a *manifests.ManifestError naming the field.
type InvalidError struct{ Errs []error }

func (e *InvalidError) Error() string { return errors.Join(e.Errs...).Error() }

// Invalid lists the errors.
func (e *InvalidError) Invalid() []error { return e.Errs }

// ephemeralFile is where a pod's ephemeral containers are kept.
const ephemeralFile = "ephemeral.json"

// SetEphemeralContainers sets the ephemeral containers of the running
// pod namespace/name to list, as the API server's ephemeralcontainers
// subresource does: existing ones stay as they are, new ones are checked
// and started by the pod's worker. It returns the pod as the API shows it
// now, and the fields noderun ignores as warnings.
func (e *Engine) SetEphemeralContainers(namespace, name string, list []v1.EphemeralContainer) (*v1.Pod, []error, error) {
	e.mu.Lock()
	var w *podWorker
	for _, cand := range e.workers {
		if p := cand.lastPod(); p != nil && p.Namespace == namespace && p.Name == name && !cand.isKilling() {
			w = cand
		}
	}
	var st *v1.Pod
	if w != nil && e.statuses[w.uid] != nil {
		st = e.statuses[w.uid].DeepCopy()
	}
	e.mu.Unlock()
	if w == nil || st == nil {
		return nil, nil, fmt.Errorf("%w: %s/%s", ErrPodNotFound, namespace, name)
	}
	out, warnings, err := w.setEphemeral(list)
	if err != nil {
		return nil, warnings, err
	}
	st.Spec.EphemeralContainers = out
	return st, warnings, nil
}

// setEphemeral checks list against the worker's pod, keeps it on disk and
// wakes the worker to start what is new.
func (w *podWorker) setEphemeral(list []v1.EphemeralContainer) ([]v1.EphemeralContainer, []error, error) {
	w.ephMu.Lock()
	defer w.ephMu.Unlock()
	pod := w.lastPod().DeepCopy()
	pod.Spec.EphemeralContainers = w.ephemeral()
	out, errs, warnings := manifests.EphemeralContainers(pod, list)
	if len(errs) > 0 {
		return nil, warnings, &InvalidError{errs}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, warnings, err
	}
	dir := w.podStateDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, warnings, err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, ephemeralFile), b, 0o640); err != nil {
		return nil, warnings, fmt.Errorf("save ephemeral containers of %s: %w", podRef(pod), err)
	}
	w.mu.Lock()
	w.eph = out
	w.mu.Unlock()
	w.poke()
	return out, warnings, nil
}

// ephemeral returns the pod's ephemeral containers.
func (w *podWorker) ephemeral() []v1.EphemeralContainer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.eph
}

// isEphemeral reports whether name is one of the pod's ephemeral
// containers (names are unique across a pod's three lists).
func (w *podWorker) isEphemeral(name string) bool {
	return name != "" && slices.ContainsFunc(w.ephemeral(), func(ec v1.EphemeralContainer) bool { return ec.Name == name })
}

// loadEphemeral adopts the ephemeral containers an earlier noderun kept.
func (w *podWorker) loadEphemeral() {
	b, err := os.ReadFile(filepath.Join(w.podStateDir(), ephemeralFile))
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var list []v1.EphemeralContainer
	if err == nil {
		err = json.Unmarshal(b, &list)
	}
	if err != nil {
		w.env.log.Error("ephemeral containers not adopted", "uid", w.uid, "err", err)
		return
	}
	w.mu.Lock()
	w.eph = list
	w.mu.Unlock()
}

// startEphemeral starts each ephemeral container that has never run, in
// the pod's namespaces and, with a target, in the PID namespace of the
// target's running process (unless the pod shares one PID namespace or the
// host's, as the kubelet's namespace choice). A run that ended, or could
// not start, is never started again.
func (w *podWorker) startEphemeral(ctx context.Context, pod *v1.Pod, latest map[string]*ContainerStatus) time.Duration {
	var retry time.Duration
	list := w.ephemeral()
	for i := range list {
		ec := &list[i]
		if latest[ec.Name] != nil {
			continue
		}
		s := startAction{c: (*v1.Container)(&ec.EphemeralContainerCommon)}
		if t := ec.TargetContainerName; t != "" && !pod.Spec.HostPID && !sharesPID(pod) {
			run := latest[t]
			if run == nil || run.State != StateRunning || run.PID == 0 {
				w.st.waiting[ec.Name] = waitReason{"ContainerCreating", fmt.Sprintf("waiting for target container %q to run", t)}
				retry = minPositive(retry, w.failDelay("target:"+ec.Name))
				continue
			}
			s.targetPID = run.PID
		}
		retry = minPositive(retry, w.start(ctx, pod, s, 0, nil, latest))
	}
	return retry
}

func sharesPID(pod *v1.Pod) bool {
	return pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace
}

// ephemeralStatuses are the ephemeral containers' statuses, as the
// kubelet reports them: waiting, running or terminated, never restarted.
func (w *podWorker) ephemeralStatuses(pod *v1.Pod, list []v1.EphemeralContainer, latest map[string]*ContainerStatus) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	never := pod.DeepCopy()
	never.Spec.RestartPolicy = v1.RestartPolicyNever // so no run shows as waiting for a restart
	for i := range list {
		c := (*v1.Container)(&list[i].EphemeralContainerCommon)
		cs := w.containerStatus(never, c, latest[c.Name], false)
		cs.Ready = false // not part of the pod's readiness
		out = append(out, cs)
	}
	return out
}

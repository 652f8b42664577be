package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// sync brings one pod to its spec, the way the kubelet's SyncPod does:
// sandbox first, then init containers one by one, then app containers, each
// restarted per restartPolicy with crash backoff. It returns when the worker
// should look again even if nothing wakes it (0: only on events).
func (w *podWorker) sync(ctx context.Context, pod *v1.Pod) time.Duration {
	e := w.e
	if e.terminatingSibling(pod) {
		w.publish(pod, nil)
		return 0
	}
	if !w.st.persisted {
		if err := w.persist(pod); err != nil {
			e.log.Error("save pod state", "pod", podRef(pod), "err", err)
			return w.failDelay("persist")
		}
	}
	if w.st.sandboxOK {
		w.checkSandbox(ctx, pod)
	}
	if !w.st.sandboxOK {
		if err := w.ensureSandbox(ctx, pod); err != nil {
			w.st.netErr = err
			e.log.Error("pod sandbox", "pod", podRef(pod), "err", err)
			w.publish(pod, nil)
			return w.failDelay("sandbox")
		}
		w.st.netErr = nil
		delete(w.st.backoff, "sandbox")
	}
	cs, err := e.rt.ListContainers(ctx, string(pod.UID))
	if err != nil {
		// containerd is down or restarting: back off, do not hammer it.
		e.log.Error("list containers", "pod", podRef(pod), "err", err)
		return w.failDelay("list")
	}
	delete(w.st.backoff, "list")
	latest := w.newestByName(ctx, cs)
	requeue := w.syncContainers(ctx, pod, latest)
	w.publish(pod, latest)
	return requeue
}

// newestByName keeps each container name's highest restart and removes the
// rest (left when noderun died between starting a replacement and removing
// the old one).
func (w *podWorker) newestByName(ctx context.Context, cs []ContainerStatus) map[string]*ContainerStatus {
	latest := map[string]*ContainerStatus{}
	for i := range cs {
		c := &cs[i]
		if old := latest[c.Name]; old == nil || c.RestartCount > old.RestartCount {
			latest[c.Name] = c
		}
	}
	for i := range cs {
		if latest[cs[i].Name].ID != cs[i].ID {
			w.remove(ctx, cs[i].ID)
		}
	}
	return latest
}

func (w *podWorker) remove(ctx context.Context, id string) {
	if err := w.e.rt.RemoveContainer(ctx, id); err != nil {
		w.e.log.Warn("remove container", "container", id, "err", err)
	}
}

func (w *podWorker) syncContainers(ctx context.Context, pod *v1.Pod, latest map[string]*ContainerStatus) time.Duration {
	policy := pod.Spec.RestartPolicy
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		st := latest[c.Name]
		switch {
		case st == nil:
			return w.start(ctx, pod, c, true, 0, nil, latest)
		case st.State == StateExited && st.ExitCode == 0:
			continue
		case st.State == StateRunning:
			return 0
		case policy == v1.RestartPolicyNever:
			return 0 // the pod has failed
		default:
			return w.restart(ctx, pod, c, true, st, latest)
		}
	}
	var requeue time.Duration
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		st := latest[c.Name]
		var d time.Duration
		switch {
		case st == nil:
			d = w.start(ctx, pod, c, false, 0, nil, latest)
		case st.State == StateRunning && st.SpecHash != specHash(c):
			// Same UID but a new container spec: replace it.
			w.stop(ctx, pod, st.ID)
			st.State, st.FinishedAt = StateExited, w.e.clock.Now()
			d = w.start(ctx, pod, c, false, st.RestartCount+1, terminatedState(st), latest)
		case st.State == StateRunning:
		case shouldRestart(policy, st):
			d = w.restart(ctx, pod, c, false, st, latest)
		}
		if d > 0 && (requeue == 0 || d < requeue) {
			requeue = d
		}
	}
	return requeue
}

func shouldRestart(policy v1.RestartPolicy, st *ContainerStatus) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return st.State != StateExited || st.ExitCode != 0
	}
	return true
}

// restart replaces an exited container once its crash backoff has passed.
func (w *podWorker) restart(ctx context.Context, pod *v1.Pod, c *v1.Container, init bool, st *ContainerStatus, latest map[string]*ContainerStatus) time.Duration {
	b := w.st.backoff[c.Name]
	if b == nil {
		b = &backoff{}
		w.st.backoff[c.Name] = b
	}
	finished := st.FinishedAt
	if finished.IsZero() {
		finished = st.CreatedAt
	}
	wait := b.waitFor(st.ID, st.CreatedAt, finished)
	if left := wait - w.e.clock.Since(finished); left > 0 {
		w.st.waiting[c.Name] = waitReason{"CrashLoopBackOff", fmt.Sprintf(
			"back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, c.Name, pod.Name, pod.Namespace, pod.UID)}
		return left
	}
	return w.start(ctx, pod, c, init, st.RestartCount+1, terminatedState(st), latest)
}

// start pulls the image if needed, creates and starts the container, and
// removes the one it replaces.
func (w *podWorker) start(ctx context.Context, pod *v1.Pod, c *v1.Container, init bool, restart int, last *v1.ContainerStateTerminated, latest map[string]*ContainerStatus) time.Duration {
	e := w.e
	img, err := e.rt.EnsureImage(ctx, c.Image, c.ImagePullPolicy)
	if err != nil {
		return w.startFailed(pod, c, "ErrImagePull", err)
	}
	cfg, err := w.containerConfig(pod, c, init, img, restart, last)
	if err != nil {
		return w.startFailed(pod, c, "CreateContainerConfigError", err)
	}
	user, err := e.rt.StartContainer(ctx, cfg)
	if err != nil {
		return w.startFailed(pod, c, startReason(err), err)
	}
	delete(w.st.waiting, c.Name)
	delete(w.st.backoff, "start:"+c.Name)
	old := latest[c.Name]
	latest[c.Name] = &ContainerStatus{
		ID: cfg.ID, PodUID: string(pod.UID), Name: c.Name, Init: init, SpecHash: cfg.SpecHash,
		RestartCount: restart, ImageRef: img.Ref, ImageID: img.ID, State: StateRunning, CreatedAt: e.clock.Now(), LastState: last,
		User: user,
	}
	if old != nil && old.ID != cfg.ID {
		w.remove(ctx, old.ID)
	}
	e.log.Info("started container", "pod", podRef(pod), "container", c.Name, "restarts", restart)
	return 0
}

// startReason is the waiting reason for a failed StartContainer.
func startReason(err error) string {
	if errors.Is(err, ErrContainerConfig) {
		return "CreateContainerConfigError"
	}
	return "RunContainerError"
}

func (w *podWorker) startFailed(pod *v1.Pod, c *v1.Container, reason string, err error) time.Duration {
	w.e.log.Warn("container start failed", "pod", podRef(pod), "container", c.Name, "reason", reason, "err", err)
	w.st.waiting[c.Name] = waitReason{reason, err.Error()}
	return w.failDelay("start:" + c.Name)
}

// failDelay is the retry delay after another failure of the named step:
// 1 s, then the crash backoff's 10 s doubling to 5 min.
func (w *podWorker) failDelay(step string) time.Duration {
	b := w.st.backoff[step]
	if b == nil {
		b = &backoff{}
		w.st.backoff[step] = b
	}
	b.forID = "" // every failure counts, so retries slow down
	return max(b.waitFor(step, time.Time{}, time.Time{}), time.Second)
}

func terminatedState(st *ContainerStatus) *v1.ContainerStateTerminated {
	return &v1.ContainerStateTerminated{
		ExitCode:    int32(st.ExitCode),
		Reason:      exitReason(st.ExitCode),
		StartedAt:   metav1.NewTime(st.CreatedAt),
		FinishedAt:  metav1.NewTime(st.FinishedAt),
		ContainerID: "containerd://" + st.ID,
	}
}

func exitReason(code int) string {
	if code == 0 {
		return "Completed"
	}
	return "Error"
}

// stop stops one container with the pod's grace period.
func (w *podWorker) stop(ctx context.Context, pod *v1.Pod, id string) {
	if err := w.e.rt.StopContainer(ctx, id, gracePeriod(pod)); err != nil {
		w.e.log.Warn("stop container", "container", id, "err", err)
	}
}

func gracePeriod(pod *v1.Pod) time.Duration {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

// terminate stops every container of the pod in parallel, then removes them,
// the network, volumes and the pod's directories. Each step is idempotent so
// a crash half-way is repaired by running it again.
func (w *podWorker) terminate(ctx context.Context, pod *v1.Pod) error {
	e := w.e
	cs := w.stopAll(ctx, pod)
	var errs []error
	for _, c := range cs {
		errs = append(errs, e.rt.RemoveContainer(ctx, c.ID))
	}
	if pod != nil && pod.UID == "" {
		pod.UID = w.uid
	}
	errs = append(errs, e.net.Teardown(ctx, w.sandbox(pod)))
	errs = append(errs, unmountVolumes(w.podStateDir()), unmountAll(w.podRunDir()))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	removeCgroup(w.cgroupParent())
	errs = append(errs,
		os.RemoveAll(w.podStateDir()),
		os.RemoveAll(w.podRunDir()),
		os.RemoveAll(w.podLogDir(pod)))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.log.Info("pod removed", "pod", podRef(pod), "uid", w.uid)
	return nil
}

func (w *podWorker) podStateDir() string {
	return filepath.Join(w.e.cfg.StateDir, "pods", string(w.uid))
}

func (w *podWorker) podRunDir() string {
	return filepath.Join(w.e.cfg.RunDir, "pods", SandboxID(string(w.uid)))
}

func (w *podWorker) podLogDir(pod *v1.Pod) string {
	return filepath.Join(w.e.cfg.PodLogDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, w.uid))
}

func (w *podWorker) cgroupParent() string {
	return w.e.cfg.CgroupRoot + "/pod" + SandboxID(string(w.uid))
}

func (w *podWorker) sandbox(pod *v1.Pod) *Sandbox {
	return &Sandbox{
		ID:               SandboxID(string(w.uid)),
		PodUID:           string(w.uid),
		PodName:          pod.Name,
		Namespace:        pod.Namespace,
		Hostname:         utsHostname(pod),
		HostNetwork:      pod.Spec.HostNetwork,
		HostPID:          pod.Spec.HostPID,
		HostIPC:          pod.Spec.HostIPC,
		SharePID:         pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace,
		Dir:              w.podRunDir(),
		Ports:            hostPorts(pod),
		IngressBandwidth: pod.Annotations["kubernetes.io/ingress-bandwidth"],
		EgressBandwidth:  pod.Annotations["kubernetes.io/egress-bandwidth"],
	}
}

func hostPorts(pod *v1.Pod) []PortMapping {
	var out []PortMapping
	for _, c := range allContainers(pod) {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				out = append(out, PortMapping{HostPort: int(p.HostPort), ContainerPort: int(p.ContainerPort),
					Protocol: string(p.Protocol), HostIP: p.HostIP})
			}
		}
	}
	return out
}

// ensureSandbox sets up namespaces, network, pod files and volumes. A
// sandbox found from an earlier noderun is checked deeply once; containers
// left running in a sandbox that had to be made anew are stopped, so they
// restart (per restartPolicy) inside the new one, as the kubelet does.
func (w *podWorker) ensureSandbox(ctx context.Context, pod *v1.Pod) error {
	if _, err := kernelHostname(pod); err != nil && !pod.Spec.HostNetwork {
		return err
	}
	resolv, err := resolvConfig(pod, w.e.cfg.ResolvConf)
	if err != nil {
		return err
	}
	sb := w.sandbox(pod)
	sb.DNS = resolv
	ips, fresh, err := w.e.net.Setup(ctx, sb)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if !fresh && !pod.Spec.HostNetwork {
		if err := w.e.net.Check(ctx, sb, true); errors.Is(err, ErrSandboxBroken) {
			w.e.log.Warn("adopted pod sandbox is broken; recreating it", "pod", podRef(pod), "err", err)
			if err := w.e.net.Teardown(ctx, sb); err != nil {
				return fmt.Errorf("network teardown: %w", err)
			}
			if ips, fresh, err = w.e.net.Setup(ctx, sb); err != nil {
				return fmt.Errorf("network: %w", err)
			}
		}
	}
	if fresh {
		w.stopAll(ctx, pod)
	}
	w.st.checked = w.e.clock.Now()
	w.st.ips = ips
	if err := w.writePodFiles(pod, resolv); err != nil {
		return err
	}
	if err := w.setupVolumes(pod); err != nil {
		return err
	}
	w.st.sandboxOK = true
	return nil
}

// checkSandbox verifies a running pod's network on every sync, cheaply
// except every NetworkCheck, and marks the sandbox for recreation when it
// broke underneath the pod.
func (w *podWorker) checkSandbox(ctx context.Context, pod *v1.Pod) {
	if pod.Spec.HostNetwork {
		return
	}
	every := w.e.cfg.NetworkCheck
	deep := every > 0 && w.e.clock.Since(w.st.checked) >= every
	if deep {
		w.st.checked = w.e.clock.Now()
	}
	if err := w.e.net.Check(ctx, w.sandbox(pod), deep); errors.Is(err, ErrSandboxBroken) {
		w.e.log.Warn("pod network broke; recreating the sandbox", "pod", podRef(pod), "err", err)
		if err := w.e.net.Teardown(ctx, w.sandbox(pod)); err != nil {
			w.e.log.Error("network teardown", "pod", podRef(pod), "err", err)
		}
		w.st.sandboxOK = false
	}
}

// stopAll stops the pod's running containers in parallel with its grace
// period; their exits then go through the normal restart logic.
func (w *podWorker) stopAll(ctx context.Context, pod *v1.Pod) []ContainerStatus {
	cs, err := w.e.rt.ListContainers(ctx, string(w.uid))
	if err != nil {
		w.e.log.Warn("list containers", "pod", podRef(pod), "err", err)
		return nil
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		if c.State == StateRunning {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.stop(ctx, pod, c.ID)
			}()
		}
	}
	wg.Wait()
	return cs
}

// persist records the pod on disk, so that after a noderun restart a pod
// whose manifest disappeared meanwhile is still torn down with its own spec,
// and the pod keeps its start time.
func (w *podWorker) persist(pod *v1.Pod) error {
	dir := w.podStateDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	if prev, err := w.e.loadPod(pod.UID); err == nil && prev.Status.StartTime != nil {
		w.st.started = prev.Status.StartTime.Time
	} else {
		w.st.started = w.e.clock.Now()
	}
	rec := pod.DeepCopy()
	rec.Status = v1.PodStatus{StartTime: &metav1.Time{Time: w.st.started}}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, "pod.json"), b, 0o640); err != nil {
		return err
	}
	w.st.persisted = true
	return nil
}

func (e *Engine) loadPod(uid types.UID) (*v1.Pod, error) {
	b, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "pods", string(uid), "pod.json"))
	if err != nil {
		return nil, err
	}
	var p v1.Pod
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// metaOf rebuilds a pod's identity from a container's labels.
func metaOf(c ContainerStatus) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: c.PodName, Namespace: c.PodNamespace, UID: types.UID(c.PodUID)}
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

package runner

import (
	"errors"
	"io/fs"
	"os"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// publish computes the pod's status from what the runtime reported, the
// decision just taken and the probes, and stores it for the status API.
func (w *podWorker) publish(pod *v1.Pod, latest map[string]*ContainerStatus, acts podActions) *v1.PodStatus {
	out := pod.DeepCopy()
	s := &out.Status
	s.HostIP = w.env.cfg.HostIP
	if s.HostIP != "" {
		s.HostIPs = []v1.HostIP{{IP: s.HostIP}}
	}
	if !w.st.started.IsZero() {
		s.StartTime = &metav1.Time{Time: w.st.started}
	}
	s.QOSClass = QOSClass(pod)
	ips := w.st.ips
	if pod.Spec.HostNetwork && s.HostIP != "" {
		ips = []string{s.HostIP}
	}
	for _, ip := range ips {
		s.PodIPs = append(s.PodIPs, v1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		s.PodIP = ips[0]
	}
	initDone := acts.initDone
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		s.InitContainerStatuses = append(s.InitContainerStatuses, w.containerStatus(pod, c, latest[c.Name], true))
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := w.containerStatus(pod, c, latest[c.Name], false)
		if !initDone && cs.State.Waiting != nil && cs.LastTerminationState.Terminated == nil {
			cs.State.Waiting.Reason = "PodInitializing"
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	if eph := w.ephemeral(); len(eph) > 0 {
		out.Spec.EphemeralContainers = eph
		s.EphemeralContainerStatuses = w.ephemeralStatuses(pod, eph, latest)
	}
	s.Phase = podPhase(pod, s, initDone)
	switch acts.failed {
	case reasonDeadlineExceeded:
		s.Phase, s.Reason, s.Message = v1.PodFailed, reasonDeadlineExceeded, "Pod was active on the node longer than the specified deadline"
	case reasonShutdown: // as the kubelet's shutdown manager leaves it
		if s.Phase != v1.PodSucceeded {
			s.Phase = v1.PodFailed
		}
		s.Reason, s.Message = reasonShutdown, shutdownMessage
	}
	s.Conditions = w.conditions(pod, s, initDone)
	if acts.failed == reasonShutdown {
		s.Conditions = append(s.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue,
			Reason: v1.PodReasonTerminationByKubelet, Message: shutdownMessage,
			LastTransitionTime: w.transition(v1.DisruptionTarget, v1.ConditionTrue, metav1.NewTime(w.env.clock.Now()))})
	}
	if c, ok := restartAllCondition(pod, s.Phase, acts.resetAll); ok {
		c.LastTransitionTime = w.transition(c.Type, c.Status, metav1.NewTime(w.env.clock.Now()))
		s.Conditions = append(s.Conditions, c)
	}
	w.board.setStatus(out)
	return s
}

// publishPending reports a new pod as Pending before its first sync, as
// the kubelet's SyncPod sets the status before it makes the sandbox (a
// watch sees Pending, then Running). A pod run before (its state dir
// exists) is left to the sync, which finds its containers: a restart of
// noderun does not flash running pods back to Pending.
func (w *podWorker) publishPending(pod *v1.Pod) {
	if _, err := os.Stat(w.podStateDir()); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	w.publish(pod, nil, podActions{initDone: len(pod.Spec.InitContainers) == 0})
}

func (w *podWorker) containerStatus(pod *v1.Pod, c *v1.Container, st *ContainerStatus, init bool) v1.ContainerStatus {
	cs := v1.ContainerStatus{Name: c.Name, Image: c.Image, VolumeMounts: w.volumeMountStatuses(c)}
	f := false
	cs.Started = &f
	if st == nil {
		reason := waitReason{reason: "ContainerCreating"}
		if r, ok := w.st.waiting[c.Name]; ok {
			reason = r
		} else if w.st.netErr != nil {
			reason = waitReason{"ContainerCreating", w.st.netErr.Error()}
		}
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: reason.reason, Message: reason.message}
		if n, ok := w.st.reset[c.Name]; ok {
			cs.RestartCount, cs.LastTerminationState.Terminated = int32(n), resetLastState()
		}
		return cs
	}
	cs.ContainerID = "containerd://" + st.ID
	cs.ImageID = st.ImageID
	if st.ImageRef != "" {
		cs.Image = st.ImageRef
	}
	cs.RestartCount = int32(st.RestartCount)
	if st.User != nil {
		cs.User = &v1.ContainerUser{Linux: st.User}
	}
	if st.LastState != nil {
		last := *st.LastState
		if last.Message == "" && st.RestartCount > 0 {
			// Messages are not kept in labels; the previous run's file is.
			last.Message = w.terminationMessage(pod, c, st.RestartCount-1, int(last.ExitCode))
		}
		cs.LastTerminationState.Terminated = &last
	}
	switch st.State {
	case StateRunning:
		started := w.env.probes.Started(pod.UID, c.Name, st.ID)
		cs.Started = &started
		// A regular init container is ready once it has completed.
		cs.Ready = (!init || isSidecar(c)) && w.env.probes.Ready(pod.UID, c.Name, st.ID)
		cs.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(st.CreatedAt)}
	case StateUnknown:
		// What the kubelet shows for a state its runtime cannot tell.
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: "ContainerStatusUnknown",
			Message: "the container runtime cannot tell this container's state; it is left alone until it can"}
	case StateCreated:
		// Made but never started (noderun stopped between the two): it
		// is started again, as the kubelet starts a Created container.
		reason := waitReason{reason: "ContainerCreating"}
		if r, ok := w.st.waiting[c.Name]; ok {
			reason = r
		}
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: reason.reason, Message: reason.message}
	case StateExited:
		term := w.terminated(pod, c, st)
		cs.Ready = init && !isSidecar(c) && st.State == StateExited && st.ExitCode == 0
		if r, ok := w.st.waiting[c.Name]; ok && ((init && isSidecar(c)) || shouldStart(&pod.Spec, c, st)) {
			// Waiting to be restarted: what just ended becomes lastState.
			cs.State.Waiting = &v1.ContainerStateWaiting{Reason: r.reason, Message: r.message}
			cs.LastTerminationState.Terminated = term
		} else {
			cs.State.Terminated = term
		}
	}
	return cs
}

// volumeMountStatuses are the container's mounts as the kubelet v1.37
// reports them (RecursiveReadOnlyMounts GA): a read-only one says whether
// it is recursively read-only.
func (w *podWorker) volumeMountStatuses(c *v1.Container) []v1.VolumeMountStatus {
	var out []v1.VolumeMountStatus
	for _, m := range c.VolumeMounts {
		s := v1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly}
		if m.ReadOnly {
			mode := v1.RecursiveReadOnlyDisabled
			if rro, err := recursiveReadOnly(m, w.env.cfg.RecursiveReadOnlyMounts); err == nil && rro {
				mode = v1.RecursiveReadOnlyEnabled
			}
			s.RecursiveReadOnly = &mode
		}
		out = append(out, s)
	}
	return out
}

// podPhase follows the kubelet's getPhase with ContainerRestartRules on: a
// failed init container that will not run again fails the pod; once all
// app containers have stopped, the pod runs on while any of them is to be
// restarted (restartOnExit), and else succeeded or failed.
func podPhase(pod *v1.Pod, s *v1.PodStatus, initDone bool) v1.PodPhase {
	if !initDone {
		for i, cs := range s.InitContainerStatuses {
			if t := cs.State.Terminated; t != nil && t.ExitCode != 0 && !restartOnExit(&pod.Spec, &pod.Spec.InitContainers[i], t.ExitCode) {
				return v1.PodFailed
			}
		}
		return v1.PodPending
	}
	var running, waiting, stopped, final, succeeded int
	for i, cs := range s.ContainerStatuses {
		t := cs.State.Terminated
		switch {
		case cs.State.Running != nil:
			running++
			continue
		case t != nil:
			if t.ExitCode == 0 {
				succeeded++
			}
		case cs.LastTerminationState.Terminated != nil:
			t = cs.LastTerminationState.Terminated
		default:
			waiting++
			continue
		}
		stopped++
		if !restartOnExit(&pod.Spec, &pod.Spec.Containers[i], t.ExitCode) {
			final++
		}
	}
	switch {
	case waiting > 0:
		return v1.PodPending
	case running > 0:
		return v1.PodRunning
	case stopped == 0:
		return v1.PodPending
	case stopped != final:
		return v1.PodRunning // some are to be restarted
	case stopped == succeeded:
		return v1.PodSucceeded
	}
	return v1.PodFailed
}

func (w *podWorker) conditions(pod *v1.Pod, s *v1.PodStatus, initDone bool) []v1.PodCondition {
	// Sidecars count for readiness like app containers (Kubernetes 1.29+).
	ready := len(s.ContainerStatuses) > 0
	for _, cs := range s.ContainerStatuses {
		ready = ready && cs.Ready
	}
	for i, cs := range s.InitContainerStatuses {
		if isSidecar(&pod.Spec.InitContainers[i]) {
			ready = ready && cs.Ready
		}
	}
	if s.Phase == v1.PodSucceeded || s.Phase == v1.PodFailed {
		ready = false
	}
	now := metav1.NewTime(w.env.clock.Now())
	cond := func(t v1.PodConditionType, ok bool) v1.PodCondition {
		st := v1.ConditionFalse
		if ok {
			st = v1.ConditionTrue
		}
		return v1.PodCondition{Type: t, Status: st, LastTransitionTime: w.transition(t, st, now)}
	}
	sandbox := cond(v1.PodReadyToStartContainers, w.st.sandboxOK)
	if err := w.st.netErr; err != nil {
		sandbox.Reason, sandbox.Message = "FailedCreatePodSandBox", err.Error()
		if errors.Is(err, ErrNetworkNotReady) {
			sandbox.Reason = "NetworkNotReady"
		}
	}
	// Once initialized, a pod stays so while init containers run again
	// (RestartAllContainers, a new sandbox), as the kubelet v1.37 keeps it.
	initialized := initDone || w.st.conds[v1.PodInitialized].status == v1.ConditionTrue
	return []v1.PodCondition{
		sandbox,
		cond(v1.PodInitialized, initialized),
		cond(v1.PodReady, ready),
		cond(v1.ContainersReady, ready),
		cond(v1.PodScheduled, true),
	}
}

// transition keeps a condition's lastTransitionTime until its status changes.
func (w *podWorker) transition(t v1.PodConditionType, st v1.ConditionStatus, now metav1.Time) metav1.Time {
	if w.st.conds == nil {
		w.st.conds = map[v1.PodConditionType]condState{}
	}
	if c, ok := w.st.conds[t]; ok && c.status == st {
		return c.since
	}
	w.st.conds[t] = condState{st, now}
	return now
}

type condState struct {
	status v1.ConditionStatus
	since  metav1.Time
}

package runner

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
)

// ensureCgroup makes the pod's cgroup with the kubelet's limits in its QoS
// parent, whose shares are brought up to date first, as the kubelet does
// before it makes a pod's cgroup. An adopted pod's cgroup is kept and its
// (unchanged) limits written again.
func (w *podWorker) ensureCgroup(ctx context.Context, pod *v1.Pod) error {
	cfg := w.env.cfg
	if !cfg.PodCgroups {
		return nil
	}
	if err := w.board.updateQoS(ctx); err != nil {
		return err
	}
	return cfg.Cgroups.EnsurePod(ctx, w.cgroupParent(pod), podCgroupResources(pod))
}

// removeCgroup removes the pod's cgroup once its containers are gone,
// from every QoS tier (a pod an older noderun started has its cgroup at
// the top, where Guaranteed pods' are), then updates the QoS parents'
// shares without it.
func (w *podWorker) removeCgroup(ctx context.Context) error {
	cfg := w.env.cfg
	var errs []error
	for _, t := range []cgroups.Tier{cgroups.Guaranteed, cgroups.Burstable, cgroups.BestEffort} {
		errs = append(errs, cfg.Cgroups.RemovePod(ctx, cfg.Cgroups.PodParent(t, SandboxID(string(w.uid)))))
	}
	if cfg.PodCgroups {
		errs = append(errs, w.board.updateQoS(ctx))
	}
	return errors.Join(errs...)
}

// podEnded takes an ended pod (its processes gone) out of its QoS
// parent's shares, once, as the kubelet counts only active pods. Its
// cgroup stays until the pod is removed: its exited containers keep
// theirs, their tasks kept for their status.
func (w *podWorker) podEnded(ctx context.Context, pod *v1.Pod) {
	if w.st.endedCounted || !w.env.cfg.PodCgroups {
		return
	}
	w.st.endedCounted = true
	if err := w.board.updateQoS(ctx); err != nil {
		w.env.log.Warn("QoS cgroups not updated", "pod", podRef(pod), "err", err)
	}
}

func (w *podWorker) cgroupParent(pod *v1.Pod) string {
	return w.env.cfg.Cgroups.PodParent(qosTier(pod), SandboxID(string(w.uid)))
}

// CgroupParent is the cgroup parent of the pod's containers: its cgroup in
// its QoS parent.
func CgroupParent(l cgroups.Layout, pod *v1.Pod) string {
	return l.PodParent(qosTier(pod), SandboxID(string(pod.UID)))
}

// updateQoS sets the QoS parents' shares from the pods now wanted (not
// being torn down, not ended), as the kubelet's UpdateQOSCgroups does from
// its active pods: Burstable's from the sum of their cpu requests. Calls
// are taken one at a time, each summing the pods as they are then.
func (e *Engine) updateQoS(ctx context.Context) error {
	e.qosMu.Lock()
	defer e.qosMu.Unlock()
	var milli int64
	e.mu.Lock()
	for uid, w := range e.workers {
		if st := e.statuses[uid]; st != nil && (st.Status.Phase == v1.PodSucceeded || st.Status.Phase == v1.PodFailed) {
			continue
		}
		if p := w.wantedPod(); p != nil && QOSClass(p) == v1.PodQOSBurstable {
			milli += totalsOf(p).cpuRequest
		}
	}
	e.mu.Unlock()
	return e.cfg.Cgroups.UpdateQoS(ctx, milliCPUToShares(milli))
}

// wantedPod is the pod the worker runs, nil once it is being torn down.
func (w *podWorker) wantedPod() *v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.desired
}

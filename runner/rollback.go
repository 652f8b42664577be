package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/manifests"
)

// Rollback (noderun.dev/rollback-after): the engine keeps, for each pod
// name, the last version (spec) of it that was Ready. A version with the
// annotation that is not Ready within its deadline of its start is
// replaced by that one; the manifest stays as it is, and the failed
// version is not run again until the manifest changes (a new UID). Both
// are kept on disk (rolloutDir), so a noderun restart changes nothing.

const (
	reasonRolledBack = "RolledBack"
	// reasonRollbackUnavailable: the deadline passed, but no earlier
	// version of the pod was ever Ready; the failing one keeps running.
	reasonRollbackUnavailable = "RollbackUnavailable"
	// ConditionRolledBack is the condition of the version rolled back to,
	// with the failed version's reason and message, until the manifest
	// changes.
	ConditionRolledBack v1.PodConditionType = manifests.AnnotationPrefix + "RolledBack"
)

// rollout is what is kept of one pod name: its last Ready version and the
// version rolled back from, if any.
type rollout struct {
	Ready  *v1.Pod        `json:"ready,omitempty"`
	Failed *failedVersion `json:"failed,omitempty"`
}

type failedVersion struct {
	UID     types.UID   `json:"uid"`
	Reason  string      `json:"reason"`
	Message string      `json:"message"`
	At      metav1.Time `json:"at"`
}

// rolloutDir holds one file per pod name, <namespace>_<name> (neither
// holds "_", and the pair fits a file name: its log dir, which adds the
// UID, does), with its rollout as JSON.
func rolloutDir(stateDir string) string { return filepath.Join(stateDir, "rollback") }

func rolloutPath(stateDir, ref string) string {
	return filepath.Join(rolloutDir(stateDir), strings.Replace(ref, "/", "_", 1))
}

// loadRollouts reads what was kept, before the first reconcile. A file
// that cannot be read is logged and left: rollback is lost for that pod,
// nothing else.
func (e *Engine) loadRollouts() {
	ents, err := os.ReadDir(rolloutDir(e.cfg.StateDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("rollback records unreadable", "err", err)
	}
	for _, d := range ents {
		if strings.HasPrefix(d.Name(), ".") || !d.Type().IsRegular() {
			continue // a write a crash interrupted
		}
		var r rollout
		b, err := os.ReadFile(filepath.Join(rolloutDir(e.cfg.StateDir), d.Name()))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.Ready == nil {
			e.log.Warn("rollback record unreadable; ignored", "file", d.Name(), "err", err)
			continue
		}
		e.rollouts[podRef(r.Ready)] = &r
	}
}

// saveRollout records r for the pod name ref (nil: forgets it), on disk
// first. e.rolloutMu is held.
func (e *Engine) saveRollout(ref string, r *rollout) error {
	path := rolloutPath(e.cfg.StateDir, ref)
	if r == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	} else {
		b, err := json.Marshal(r)
		if err == nil {
			err = os.MkdirAll(rolloutDir(e.cfg.StateDir), 0o750)
		}
		if err == nil {
			err = atomicfile.WriteFile(path, b, 0o640)
		}
		if err != nil {
			return fmt.Errorf("rollback record of %s: %w", ref, err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if r == nil {
		delete(e.rollouts, ref)
	} else {
		e.rollouts[ref] = r
	}
	return nil
}

// rolloutOf returns what is kept of pod name ref, or nil.
func (e *Engine) rolloutOf(ref string) *rollout {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rollouts[ref]
}

// versionReady records pod, Ready now, as its name's last Ready version.
func (e *Engine) versionReady(pod *v1.Pod) error {
	e.rolloutMu.Lock()
	defer e.rolloutMu.Unlock()
	cur := e.rolloutOf(podRef(pod))
	if cur != nil && cur.Ready != nil && cur.Ready.UID == pod.UID {
		return nil
	}
	spec := pod.DeepCopy()
	spec.Status, spec.ResourceVersion = v1.PodStatus{}, ""
	next := &rollout{Ready: spec}
	if cur != nil {
		next.Failed = cur.Failed // ended only by a manifest change
	}
	return e.saveRollout(podRef(pod), next)
}

// rollBack replaces pod, a version not Ready within its deadline, by the
// last Ready version of its name, if there is one; it reports whether it
// did (or had done so).
func (e *Engine) rollBack(pod *v1.Pod, after time.Duration, reason, message string) (bool, error) {
	e.rolloutMu.Lock()
	defer e.rolloutMu.Unlock()
	ref := podRef(pod)
	cur := e.rolloutOf(ref)
	now := e.clock.Now()
	switch {
	case cur != nil && cur.Failed != nil && cur.Failed.UID == pod.UID:
		return true, nil
	case cur == nil || cur.Ready.UID == pod.UID: // never Ready, or Ready once: not a failed update
		if cur == nil {
			e.events.record(pod, "", "", v1.EventTypeWarning, reasonRollbackUnavailable, fmt.Sprintf(
				"Not Ready within %s (%s: %s), but no earlier version of the pod was ever Ready: this one keeps running", after, reason, message), now)
		}
		return false, nil
	}
	msg := fmt.Sprintf("Version %s was not Ready within %s of its start (%s: %s); rolled back to version %s, the last that was Ready. The manifest is unchanged; version %s is not run again until it changes",
		pod.UID, after, reason, message, cur.Ready.UID, pod.UID)
	next := &rollout{Ready: cur.Ready, Failed: &failedVersion{UID: pod.UID, Reason: reason, Message: msg, At: metav1.NewTime(now)}}
	if err := e.saveRollout(ref, next); err != nil {
		return false, err
	}
	e.log.Warn("pod rolled back", "pod", ref, "failed", pod.UID, "to", cur.Ready.UID, "reason", reason, "message", message)
	e.events.record(cur.Ready, "", "", v1.EventTypeWarning, reasonRolledBack, msg, now)
	select {
	case e.rolloutChanged <- struct{}{}:
	default:
	}
	return true, nil
}

// versionToRunLocked is what runs for p, a pod from a source: the version
// rolled back to while p's UID is the one that failed, else p. A source
// pod of that name with another UID (the manifest changed) ends the
// rollback: it is added to ended. e.mu is held.
func (e *Engine) versionToRunLocked(p *v1.Pod, ended map[string]bool) *v1.Pod {
	r := e.rollouts[podRef(p)]
	switch {
	case r == nil || r.Failed == nil:
		return p
	case r.Failed.UID == p.UID:
		return r.Ready
	}
	ended[podRef(p)] = true
	return p
}

// endRollbacks forgets the failed versions of the names in ended, whose
// manifests changed: the new version runs. Names no source defines any
// more are forgotten altogether once every source has answered, so a pod
// of that name defined later does not roll back to a stranger.
func (e *Engine) endRollbacks(ended map[string]bool, defined map[string]bool, allAnswered bool) {
	e.rolloutMu.Lock()
	defer e.rolloutMu.Unlock()
	e.mu.Lock()
	refs := make([]string, 0, len(e.rollouts))
	for ref := range e.rollouts {
		refs = append(refs, ref)
	}
	e.mu.Unlock()
	for _, ref := range refs {
		cur := e.rolloutOf(ref)
		var err error
		switch {
		case !defined[ref] && allAnswered:
			err = e.saveRollout(ref, nil)
		case ended[ref] && cur.Failed != nil:
			e.log.Info("manifest changed: the version rolled back from is no longer run", "pod", ref, "failed", cur.Failed.UID)
			err = e.saveRollout(ref, &rollout{Ready: cur.Ready})
		}
		if err != nil {
			e.log.Warn("rollback record", "pod", ref, "err", err)
		}
	}
}

// rolledBackLocked adds the RolledBack condition to the status of the
// version rolled back to. e.mu is held.
func (e *Engine) rolledBackLocked(pod *v1.Pod) {
	r := e.rollouts[podRef(pod)]
	if r == nil || r.Failed == nil || r.Ready.UID != pod.UID {
		return
	}
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: ConditionRolledBack, Status: v1.ConditionTrue,
		Reason: r.Failed.Reason, Message: r.Failed.Message, LastTransitionTime: r.Failed.At})
}

// watchRollout records the pod's version once it is Ready; a version with
// a rollback deadline that passes first is rolled back. It returns when
// to look again (0: no deadline to wait for).
func (w *podWorker) watchRollout(pod *v1.Pod, s *v1.PodStatus) time.Duration {
	if podReady(s) {
		if !w.st.readyKept {
			if err := w.board.versionReady(pod); err != nil {
				w.env.log.Warn("last Ready version not kept", "pod", podRef(pod), "err", err)
				return w.failDelay("rollout")
			}
			w.st.readyKept = true
		}
		return 0
	}
	after, ok := manifests.RollbackAfter(pod)
	if !ok || w.st.readyKept || w.st.rollbackAsked || w.st.started.IsZero() {
		return 0
	}
	if left := w.st.started.Add(after).Sub(w.env.clock.Now()); left > 0 {
		return left
	}
	reason, msg := notReady(s)
	if _, err := w.board.rollBack(pod, after, reason, msg); err != nil {
		w.env.log.Error("rollback failed; will retry", "pod", podRef(pod), "err", err)
		return w.failDelay("rollout")
	}
	w.st.rollbackAsked = true
	return 0
}

func podReady(s *v1.PodStatus) bool {
	return slices.ContainsFunc(s.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.PodReady && c.Status == v1.ConditionTrue
	})
}

// notReady says why a pod is not Ready, as the kubelet's ContainersNotReady
// condition does, with the first reason a container gives in its place.
func notReady(s *v1.PodStatus) (reason, message string) {
	reason = "ContainersNotReady"
	var names, why []string
	for _, cs := range slices.Concat(s.InitContainerStatuses, s.ContainerStatuses) {
		if cs.Ready || cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0 {
			continue // a completed init container needs no readiness
		}
		names = append(names, cs.Name)
		r, m := "", ""
		switch st := cs.State; {
		case st.Waiting != nil:
			r, m = st.Waiting.Reason, st.Waiting.Message
		case st.Terminated != nil:
			r, m = st.Terminated.Reason, fmt.Sprintf("exit code %d", st.Terminated.ExitCode)
		}
		if r == "" {
			continue // running, not ready: its readiness probe fails
		}
		if len(why) == 0 {
			reason = r
		}
		if m != "" {
			r += ": " + m
		}
		why = append(why, cs.Name+": "+r)
	}
	message = "containers with unready status: [" + strings.Join(names, " ") + "]"
	if len(why) > 0 {
		message += "; " + strings.Join(why, "; ")
	}
	return reason, message
}

package runner

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/runner/prober"
	"github.com/noderun/noderun/runner/volume"
)

// minKillGrace is the least a container gets to stop, whatever its grace
// period or its preStop hook left: the kubelet never stops with less.
const minKillGrace = 2 * time.Second

// The kubelet's limits on a termination message: the file is read up to
// 4 KiB; the fallback to logs takes at most 80 lines and 2 KiB.
const (
	maxMessageBytes    = 4 * 1024
	maxLogMessageLines = 80
	maxLogMessageBytes = 2 * 1024
)

// killContainer stops one container as the kubelet's killContainer does:
// the Killing event, then the preStop hook inside the grace period, then
// the stop signal with what is left of it (at least 2 s).
func (w *podWorker) killContainer(ctx context.Context, pod *v1.Pod, k killAction) {
	w.event(pod, k.c.Name, k.init, v1.EventTypeNormal, "Killing", k.message)
	grace := k.grace
	if h := preStop(k.c); h != nil && grace > 0 {
		began := w.env.clock.Now()
		hctx, cancel := context.WithTimeout(ctx, grace)
		err := w.runHook(hctx, pod, k.c, k.run.ID, h)
		cancel()
		if err != nil {
			w.event(pod, k.c.Name, k.init, v1.EventTypeWarning, "FailedPreStopHook", err.Error())
		}
		grace -= w.env.clock.Since(began)
	}
	// The kubelet never stops with less than 2 s, hook or not.
	grace = max(grace, minKillGrace)
	if err := w.env.rt.StopContainer(ctx, k.run.ID, grace); err != nil {
		w.env.log.Warn("stop container", "pod", podRef(pod), "container", k.c.Name, "err", err)
	}
}

// runHook runs a lifecycle handler against a container run.
func (w *podWorker) runHook(ctx context.Context, pod *v1.Pod, c *v1.Container, id string, h *v1.LifecycleHandler) error {
	return prober.DoHook(ctx, h, prober.Target{PodIP: w.probeIP(pod), ContainerID: id, Container: c}, w.env.execer)
}

func postStart(c *v1.Container) *v1.LifecycleHandler {
	if c.Lifecycle == nil {
		return nil
	}
	return c.Lifecycle.PostStart
}

func preStop(c *v1.Container) *v1.LifecycleHandler {
	if c.Lifecycle == nil {
		return nil
	}
	return c.Lifecycle.PreStop
}

// probeIP is where noderun reaches the pod: its IP, or for a hostNetwork pod
// the node's (loopback when the node's address is not known).
func (w *podWorker) probeIP(pod *v1.Pod) string {
	if pod.Spec.HostNetwork || len(w.st.ips) == 0 {
		if w.env.cfg.HostIP != "" {
			return w.env.cfg.HostIP
		}
		return "127.0.0.1"
	}
	return w.st.ips[0]
}

// terminated describes how a run ended, as containerStatuses report it.
func (w *podWorker) terminated(pod *v1.Pod, c *v1.Container, run *ContainerStatus) *v1.ContainerStateTerminated {
	t := &v1.ContainerStateTerminated{
		ExitCode:    int32(run.ExitCode),
		Reason:      exitReason(run),
		Message:     run.Message,
		StartedAt:   metav1.NewTime(run.CreatedAt),
		FinishedAt:  metav1.NewTime(run.FinishedAt),
		ContainerID: "containerd://" + run.ID,
	}
	if t.Message == "" && c != nil {
		t.Message = w.terminationMessage(pod, c, run.RestartCount, run.ExitCode)
	}
	return t
}

// exitReason is the kubelet's termination reason for a run.
func exitReason(run *ContainerStatus) string {
	switch {
	case run.Reason != "":
		return run.Reason
	case run.OOMKilled:
		return "OOMKilled"
	case run.ExitCode == 0:
		return "Completed"
	}
	return "Error"
}

// messagePath is the host file bind-mounted at a run's
// terminationMessagePath; one per run, so a restart starts empty. It lies
// on the pod files' tmpfs, which bounds what a container can write into
// it (the kubelet's is on disk, counted by its eviction).
func (w *podWorker) messagePath(name string, restart int) string {
	return filepath.Join(w.podFilesDir(), "termination-message."+name+"."+strconv.Itoa(restart))
}

// legacyMessagePaths are where earlier noderun versions put the file, in
// the pod's state dir: a container one of them started, adopted after an
// upgrade, is bound to it.
func (w *podWorker) legacyMessagePaths(name string, restart int) []string {
	return []string{
		filepath.Join(w.podStateDir(), "termination-message."+name+"."+strconv.Itoa(restart)),
		filepath.Join(w.podStateDir(), "containers", name, strconv.Itoa(restart)),
	}
}

// newMessageFile creates the run's empty termination message file,
// writable by whatever user the container runs as (as the kubelet does).
func (w *podWorker) newMessageFile(name string, restart int) (string, error) {
	if err := w.ensurePodFiles(0); err != nil {
		return "", err
	}
	path := w.messagePath(name, restart)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|syscall.O_NOFOLLOW, 0o666)
	if err != nil {
		return "", err
	}
	f.Close()
	return path, os.Chmod(path, 0o666)
}

// terminationMessage reads what a run left at its terminationMessagePath,
// falling back to the end of its log when the policy says so and it failed.
// Results are kept per run: an ended run's message never changes.
func (w *podWorker) terminationMessage(pod *v1.Pod, c *v1.Container, restart, exitCode int) string {
	key := c.Name + "/" + strconv.Itoa(restart)
	if m, ok := w.st.messages[key]; ok {
		return m
	}
	path := w.messagePath(c.Name, restart)
	for _, old := range w.legacyMessagePaths(c.Name, restart) {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		path = old
	}
	msg := readCapped(path, maxMessageBytes)
	if msg == "" && exitCode != 0 && c.TerminationMessagePolicy == v1.TerminationMessageFallbackToLogsOnError {
		msg = logTail(w.env.cfg.PodLogDir, filepath.Join(w.podLogDir(pod), c.Name, strconv.Itoa(restart)+".log"), maxLogMessageLines, maxLogMessageBytes)
	}
	if w.st.messages == nil {
		w.st.messages = map[string]string{}
	}
	w.st.messages[key] = msg
	return msg
}

// forgetOldRuns removes termination messages of runs before the previous
// one: only the current and last state are reported.
func (w *podWorker) forgetOldRuns(name string, restart int) {
	for r := restart - 2; r >= 0 && r >= restart-4; r-- {
		os.Remove(w.messagePath(name, r))
		for _, old := range w.legacyMessagePaths(name, r) {
			os.Remove(old)
		}
		delete(w.st.messages, name+"/"+strconv.Itoa(r))
	}
}

// pruneLogs removes the log files of a container's runs older than the
// previous one: the kubelet keeps the current run's log and the previous
// one's (kubectl logs --previous), and removes older runs with their
// containers.
func (w *podWorker) pruneLogs(pod *v1.Pod, name string, restart int) {
	// A pod with a hostPath over the pod log dir may plant links there.
	_ = volume.RemoveFilesIn(w.env.cfg.PodLogDir, filepath.Join(w.podLogDir(pod), name), func(n string) bool {
		run, _, _ := strings.Cut(n, ".")
		r, err := strconv.Atoi(run)
		return err == nil && r < restart-1
	})
}

// readCapped reads the last n bytes at most of a regular file, never following a
// link a container may have planted in its place.
func readCapped(path string, n int64) string {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	// The kubelet keeps the end of a long message (tail.ReadAtMost).
	if fi.Size() > n {
		if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// logTail returns the content of the last lines of a CRI log file, at most
// maxLines and maxBytes (the end is kept), as FallbackToLogsOnError reports.
// No link below root (the pod log dir, which pods may write to) is
// followed: the message would show a host file.
func logTail(root, path string, maxLines, maxBytes int) string {
	f, err := crilog.OpenLog(root, path)
	if err != nil {
		return ""
	}
	defer f.Close()
	// Lines are short compared to this window; reading only the end keeps
	// a huge log cheap.
	const window = 64 * 1024
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		if _, err := f.Seek(fi.Size()-window, io.SeekStart); err != nil {
			return ""
		}
	}
	var lines []string
	var partial strings.Builder
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		_, _, isPartial, content, err := crilog.ParseLine(sc.Text())
		if err != nil {
			continue // the window may start mid-line
		}
		partial.WriteString(content)
		if isPartial {
			continue
		}
		lines = append(lines, partial.String())
		partial.Reset()
		if len(lines) > maxLines {
			lines = lines[1:]
		}
	}
	out := []byte(strings.Join(lines, "\n"))
	if len(lines) > 0 {
		out = append(out, '\n')
	}
	if len(out) > maxBytes {
		out = out[len(out)-maxBytes:]
	}
	return string(bytes.ToValidUTF8(out, nil))
}

// probeResults answers the decision's questions from the prober.
type probeResults struct {
	m   *prober.Manager
	uid types.UID
}

func (p probeResults) failed(name, id string) string {
	if r, ok := p.m.Result(p.uid, name, prober.Liveness, id); ok && r == prober.Failure {
		return probeLiveness
	}
	if r, ok := p.m.Result(p.uid, name, prober.Startup, id); ok && r == prober.Failure {
		return probeStartup
	}
	return ""
}

func (p probeResults) started(name, id string) bool { return p.m.Started(p.uid, name, id) }
func (p probeResults) ready(name, id string) bool   { return p.m.Ready(p.uid, name, id) }

// execer adapts the runtime's ExecSync to the prober.
func execer(rt Runtime) prober.Execer {
	return func(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int, bool, error) {
		res, err := rt.ExecSync(ctx, id, cmd, timeout)
		return res.Output, res.ExitCode, res.TimedOut, err
	}
}

// specOf finds a container of the pod by name, init containers included.
func specOf(pod *v1.Pod, name string) *v1.Container {
	for _, c := range allContainers(pod) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func isInit(pod *v1.Pod, name string) bool {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return true
		}
	}
	return false
}

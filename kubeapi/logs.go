package kubeapi

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/crilog"
)

// Log serves pods/log: a container's log as the kubelet's ReadLogs writes
// it, the current run's or with previous=true the one before.
func (s *StreamServer) Log(w http.ResponseWriter, r *http.Request, namespace, podName string) {
	q := r.URL.Query()
	opts, previous, serr := logOptions(q, time.Now())
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	pod, serr := s.pod(namespace, podName)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	c, st, serr := findContainer(pod, q.Get("container"))
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	run, serr := logRun(pod, c, st, previous)
	if serr != nil {
		writeStatus(w, serr)
		return
	}
	id := runtimeID(st.ContainerID)
	if opts.Follow {
		if run == st.RestartCount {
			opts.Ended = s.ended(r.Context(), namespace, podName, c.Name, id)
		} else { // a previous run has ended
			ended := make(chan struct{})
			close(ended)
			opts.Ended = ended
		}
	}
	opts.Polling = s.followPolls(namespace+"/"+podName, c.Name)
	opts.Root = s.cfg.PodLogDir
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	// A log may be long, and a follow waits: each write, not the whole
	// answer, must be taken in time.
	sw := newStreamWriter(w, s.writeTimeout)
	defer sw.done()
	var out io.Writer = flushWriter{sw}
	if !opts.Follow {
		out = timedWriter{sw}
	}
	if err := crilog.ReadLog(r.Context(), s.logPath(pod, c.Name, run), out, opts); err != nil {
		// The status line is out: the error can only be logged.
		s.cfg.Log.Warn("read container log", "pod", namespace+"/"+podName, "container", c.Name, "err", err)
	}
}

// followPolls says that a follow polls the log because it cannot watch it.
func (s *StreamServer) followPolls(pod, container string) func(error) {
	return func(err error) {
		s.cfg.Log.Warn("cannot watch the container log; following it by polling every second", "pod", pod, "container", container, "err", err)
	}
}

// logRun is the restart number of the run whose log is asked for, chosen
// as the kubelet chooses the container: the current run, or the last one
// when the container waits to be restarted; with previous, the run that
// lastState describes.
func logRun(pod *v1.Pod, c *v1.Container, st *v1.ContainerStatus, previous bool) (int32, *metav1.Status) {
	if previous {
		last := st.LastTerminationState.Terminated
		if last == nil {
			return 0, badRequest(fmt.Sprintf("previous terminated container %q in pod %q not found", c.Name, pod.Name))
		}
		if runtimeID(last.ContainerID) == runtimeID(st.ContainerID) {
			return st.RestartCount, nil // waiting to restart: lastState is the last run
		}
		return st.RestartCount - 1, nil
	}
	if st.ContainerID == "" {
		reason := "ContainerCreating"
		if st.State.Waiting != nil && st.State.Waiting.Reason != "" {
			reason = st.State.Waiting.Reason
		}
		return 0, badRequest(fmt.Sprintf("container %q in pod %q is waiting to start: %s", c.Name, pod.Name, reason))
	}
	return st.RestartCount, nil
}

// logOptions reads PodLogOptions from the query as the API server
// validates them.
func logOptions(q url.Values, now time.Time) (opts crilog.ReadOptions, previous bool, _ *metav1.Status) {
	opts.TailLines = -1
	var err error
	for _, b := range []struct {
		name string
		v    *bool
	}{{"follow", &opts.Follow}, {"timestamps", &opts.Timestamps}, {"previous", &previous}} {
		if s := q.Get(b.name); s != "" {
			if *b.v, err = strconv.ParseBool(s); err != nil {
				return opts, false, badRequest(fmt.Sprintf("%s: invalid value %q: must be true or false", b.name, s))
			}
		}
	}
	if s := q.Get("tailLines"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return opts, false, badRequest(fmt.Sprintf("tailLines: invalid value %q: must be an integer greater than or equal to 0", s))
		}
		opts.TailLines = int(min(n, 1<<31))
	}
	if s := q.Get("limitBytes"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return opts, false, badRequest(fmt.Sprintf("limitBytes: invalid value %q: must be an integer greater than 0", s))
		}
		opts.LimitBytes = n
	}
	since, sinceTime := q.Get("sinceSeconds"), q.Get("sinceTime")
	if since != "" && sinceTime != "" {
		return opts, false, badRequest("at most one of `sinceTime` or `sinceSeconds` may be specified")
	}
	if since != "" {
		n, err := strconv.ParseInt(since, 10, 64)
		if err != nil || n < 1 {
			return opts, false, badRequest(fmt.Sprintf("sinceSeconds: invalid value %q: must be an integer greater than 0", since))
		}
		opts.Since = now.Add(-time.Duration(min(n, 1<<32)) * time.Second)
	}
	if sinceTime != "" {
		if opts.Since, err = time.Parse(time.RFC3339, sinceTime); err != nil {
			return opts, false, badRequest(fmt.Sprintf("sinceTime: invalid value %q: must be an RFC 3339 time", sinceTime))
		}
	}
	return opts, previous, nil
}

// timedWriter writes through the server's buffer, each write taken within
// the timeout; the server flushes the rest after the handler.
type timedWriter struct{ sw *streamWriter }

func (t timedWriter) Write(p []byte) (int, error) {
	t.sw.begin()
	return t.sw.Write(p)
}

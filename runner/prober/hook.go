package prober

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// DoHook runs a lifecycle hook as the kubelet's handler runner does, until
// it ends or ctx does. exec fails on a non-zero exit, with its output;
// httpGet only when no answer comes (the kubelet ignores the status code);
// sleep waits its seconds. The error reads as the kubelet's event message
// for the failed hook (capitalised as it writes it), without the pod's
// name.
func DoHook(ctx context.Context, h *v1.LifecycleHandler, t Target, exec Execer) error {
	name := containerName(t.Container)
	switch {
	case h.Exec != nil:
		// Unlike a probe's, a hook's command is run as written, and only
		// ctx bounds it.
		out, code, _, err := exec(ctx, t.ContainerID, h.Exec.Command, 0)
		if err == nil && code != 0 {
			// The CRI client's words for a non-zero exit.
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(h.Exec.Command, " "), code, out)
		}
		if err != nil {
			return fmt.Errorf("Exec lifecycle hook (%v) for Container %q failed - error: %w, message: %q", h.Exec.Command, name, err, out)
		}
		return nil
	case h.HTTPGet != nil:
		if err := httpHook(ctx, h.HTTPGet, t); err != nil {
			return fmt.Errorf("HTTP lifecycle hook (%s) for Container %q failed - error: %w", h.HTTPGet.Path, name, err)
		}
		return nil
	case h.Sleep != nil:
		timer := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer timer.Stop()
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("Sleep lifecycle hook (%d) for Container %q failed - error: container terminated before sleep hook finished", h.Sleep.Seconds, name)
		}
	}
	return fmt.Errorf("Cannot run handler: invalid handler: %v", h)
}

// httpHook makes an httpGet hook's request; any answer will do. As the
// kubelet, an https hook that is answered in plain HTTP is made again in
// plain HTTP, without credentials.
func httpHook(ctx context.Context, h *v1.HTTPGetAction, t Target) error {
	req, err := newRequest(ctx, h, t, "lifecycle")
	if err != nil {
		return err
	}
	resp, err := hookClient.Do(req)
	discardBody(resp)
	// net/http has no sentinel for this answer, only the words, which the
	// kubelet matches too.
	if err != nil && req.URL.Scheme == "https" && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		req = req.Clone(ctx)
		req.URL.Scheme = "http"
		req.Header.Del("Authorization")
		resp, retryErr := hookClient.Do(req)
		discardBody(resp)
		if retryErr == nil {
			err = nil
		}
	}
	return err
}

// discardBody reads a small body before closing, as the kubelet does.
func discardBody(resp *http.Response) {
	if resp == nil {
		return
	}
	if resp.ContentLength <= maxOutput {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxOutput))
	}
	resp.Body.Close()
}

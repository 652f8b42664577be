package kubeapi

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// What the streaming libraries log through klog reaches noderun's log at
// debug level, never as an error.
func TestRouteKlog(t *testing.T) {
	var buf bytes.Buffer
	RouteKlog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer klog.ClearLogger()
	klog.ErrorS(errors.New("use of closed network connection"), "Error on socket receive")
	if out := buf.String(); !strings.Contains(out, "level=DEBUG") || !strings.Contains(out, "Error on socket receive") {
		t.Errorf("logged %q, want the message at debug level", out)
	}
	buf.Reset()
	RouteKlog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	klog.ErrorS(errors.New("x"), "hidden")
	if buf.Len() != 0 {
		t.Errorf("logged %q below the log level", buf.String())
	}
}

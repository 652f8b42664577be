package cni

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
)

// timedExec runs plugins as libcni's default does and logs, at debug level,
// how long each call took: where a pod's network setup spends its time.
type timedExec struct {
	invoke.DefaultExec
	log *slog.Logger
}

func newTimedExec(log *slog.Logger) *timedExec {
	return &timedExec{
		DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}},
		log:         log,
	}
}

func (e *timedExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	t0 := time.Now()
	out, err := e.DefaultExec.ExecPlugin(ctx, pluginPath, stdin, environ)
	if e.log.Enabled(ctx, slog.LevelDebug) {
		e.log.Debug("cni plugin", "plugin", filepath.Base(pluginPath), "command", envValue(environ, "CNI_COMMAND"),
			"id", envValue(environ, "CNI_CONTAINERID"), "took", time.Since(t0), "ok", err == nil)
	}
	return out, err
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

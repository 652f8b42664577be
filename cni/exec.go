package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"
)

// pluginExec runs CNI plugins as libcni's default does (the config on
// stdin, the result or the plugin's error on stdout, a retry while the
// binary is being written), but reaps each plugin a moment after it exited
// rather than at once, and logs at debug level how long each call took:
// where a pod's network setup spends its time.
//
// Why the moment: a plugin is a Go program whose threads look up their own
// /proc entries (a network namespace is entered by the thread's
// /proc/<pid>/task/<tid>/ns/net). When its last thread exits it wakes the
// parent before dropping those entries, and a parent reaping at once
// spins in the kernel (release_task → shrink_dcache_parent) until that
// thread is done; on a busy node it is often preempted meanwhile. perf
// over a burst of 30 pods put 1.5 ms of noderun's CPU into each reap there,
// a sixth of all its CPU in the burst; reaping 2 ms later, about a tenth of
// that.
type pluginExec struct {
	invoke.DefaultExec
	log *slog.Logger
}

func newPluginExec(log *slog.Logger) *pluginExec {
	return &pluginExec{
		// FindInPath and Decode stay libcni's; ExecPlugin is ours.
		DefaultExec: invoke.DefaultExec{RawExec: &invoke.RawExec{}, PluginDecoder: version.PluginDecoder{}},
		log:         log,
	}
}

// reapDelay is how long a plugin that exited stays a zombie.
const reapDelay = 2 * time.Millisecond

// textBusyRetries and textBusyWait are libcni's: a plugin binary being
// written (an upgrade) is retried for 5 s.
const (
	textBusyRetries = 5
	textBusyWait    = time.Second
)

func (e *pluginExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	t0 := time.Now()
	out, err := runPlugin(ctx, pluginPath, stdin, environ)
	for i := 0; i < textBusyRetries && errors.Is(err, syscall.ETXTBSY); i++ {
		time.Sleep(textBusyWait)
		out, err = runPlugin(ctx, pluginPath, stdin, environ)
	}
	if e.log.Enabled(ctx, slog.LevelDebug) {
		e.log.Debug("cni plugin", "plugin", filepath.Base(pluginPath), "command", envValue(environ, "CNI_COMMAND"),
			"id", envValue(environ, "CNI_CONTAINERID"), "took", time.Since(t0), "ok", err == nil)
	}
	return out, err
}

// runPlugin runs the plugin once. A failure to start it is returned as is
// (ETXTBSY is retried); a plugin that failed yields its error as libcni
// reports it, a *types.Error.
func runPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, pluginPath)
	c.Env = environ
	c.Stdin = bytes.NewReader(stdin)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Start(); err != nil {
		if errors.Is(err, syscall.ETXTBSY) {
			return nil, err
		}
		return nil, pluginErr(err, nil, nil)
	}
	// Wait for the exit without reaping (WNOWAIT): the process stays ours
	// until Wait, so its PID cannot be reused meanwhile.
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, c.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	time.Sleep(reapDelay)
	if err := c.Wait(); err != nil {
		return nil, pluginErr(err, stdout.Bytes(), stderr.Bytes())
	}
	// A plugin's stderr on success is only informational; libcni's
	// default passes it to noderun's.
	if stderr.Len() > 0 {
		_, _ = stderr.WriteTo(os.Stderr)
	}
	return stdout.Bytes(), nil
}

// pluginErr is the error of a plugin that failed: the one it wrote on
// stdout (the CNI spec's error result) or, failing that, what it wrote on
// stderr, as libcni reports them.
func pluginErr(err error, stdout, stderr []byte) error {
	e := &types.Error{}
	switch {
	case len(stdout) == 0 && len(stderr) == 0:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	case len(stdout) == 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, err)
	default:
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
	}
	return e
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

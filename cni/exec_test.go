package cni

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// plugin writes a shell script as plugin "p" in a new dir and returns its
// path.
func plugin(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"p": "#!/bin/sh\n" + script})
	p := filepath.Join(dir, "p")
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A plugin gets its config on stdin and its environment; its stdout is the
// result, and once the call returned it is reaped.
func TestExecPluginResult(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := plugin(t, `echo $$ > `+pidFile+`; echo "{\"got\":\"$(cat)\",\"cmd\":\"$CNI_COMMAND\"}"`)
	out, err := newPluginExec(testLogger(t)).ExecPlugin(context.Background(), p, []byte("conf"), []string{"CNI_COMMAND=ADD"})
	if err != nil || string(out) != `{"got":"conf","cmd":"ADD"}`+"\n" {
		t.Fatalf("out %q, err %v", out, err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("plugin %d not reaped: %v", pid, err)
	}
}

// A plugin that fails is reported with its error result from stdout or, when
// it wrote none, with its stderr, as libcni's own exec reports them.
func TestExecPluginErrors(t *testing.T) {
	e := newPluginExec(testLogger(t))
	for _, tc := range []struct {
		script string
		code   uint
		msg    string
	}{
		{`echo '{"cniVersion":"1.0.0","code":11,"msg":"no such network","details":"x"}'; exit 1`, 11, "no such network"},
		{`echo 'bad bridge' >&2; exit 1`, 0, `netplugin failed: "bad bridge\n": exit status 1`},
		{`exit 3`, 0, "netplugin failed with no error message: exit status 3"},
		{`echo 'not json'; exit 1`, 0, `netplugin failed but error parsing its diagnostic message "not json\n"`},
	} {
		_, err := e.ExecPlugin(context.Background(), plugin(t, tc.script), nil, nil)
		var te *types.Error
		if !errors.As(err, &te) || te.Code != tc.code || !strings.HasPrefix(te.Msg, tc.msg) {
			t.Errorf("%s: err %#v; want code %d, message %q", tc.script, err, tc.code, tc.msg)
		}
	}
}

// A plugin binary still being written (ETXTBSY) is retried until it can
// run, as libcni does; a cancelled call ends the plugin.
func TestExecPluginBusyAndCancel(t *testing.T) {
	p := plugin(t, `echo '{}'`)
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { w.Close() })
	t0 := time.Now()
	out, err := newPluginExec(testLogger(t)).ExecPlugin(context.Background(), p, nil, nil)
	if err != nil || string(out) != "{}\n" || time.Since(t0) < textBusyWait {
		t.Fatalf("after %s: out %q, err %v; want a retry after %s", time.Since(t0), out, err, textBusyWait)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	if _, err := newPluginExec(testLogger(t)).ExecPlugin(ctx, plugin(t, `exec sleep 60`), nil, nil); err == nil || time.Since(t0) > 10*time.Second {
		t.Fatalf("cancelled plugin: err %v after %s", err, time.Since(t0))
	}
}

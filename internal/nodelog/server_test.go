package nodelog

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testenv"
)

// logRoot is a log directory with a file, a service's log by each of the
// kubelet's heuristics, a symlink inside it and two leading out of it.
func logRoot(t *testing.T) string {
	t.Helper()
	top := t.TempDir()
	root, outside := filepath.Join(top, "log"), filepath.Join(top, "secret")
	files := map[string]string{
		"syslog": "one\ntwo\n", "svc1": "svc1 plain\n", "svc2.log": "svc2 dot-log\n", "svc3/svc3.log": "svc3 in dir\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(body), 0o644))
	}
	must(t, os.WriteFile(outside, []byte("secret\n"), 0o644))
	must(t, os.Symlink("syslog", filepath.Join(root, "inside")))
	must(t, os.Symlink(outside, filepath.Join(root, "abs-out")))
	must(t, os.Symlink("../secret", filepath.Join(root, "rel-out.log")))
	return root
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
	return rec.Code, rec.Body.String()
}

// Files are read only under the log directory: a symlink leading out is
// refused, by query and by path, and ".." stays inside.
func TestFilesConfined(t *testing.T) {
	s := New(logRoot(t), WithJournalctl("/nonexistent/journalctl"))
	tests := []struct {
		target   string
		code     int
		contains string
	}{
		{"/?query=/syslog", 200, "one\ntwo\n"},
		{"/syslog", 200, "one\ntwo\n"},
		{"/?query=/inside", 200, "one\ntwo\n"},
		{"/?query=/abs-out", 406, "path escapes from parent"},
		{"/?query=rel-out.log/", 406, "path escapes from parent"},
		{"/abs-out", 403, "statat abs-out: path escapes from parent"},
		{"/rel-out.log", 403, "path escapes from parent"},
		{"/?query=/../secret", 406, "no such file or directory"},
		{"/../secret", 404, ""},
		{"/?query=/nope", 406, `query: Invalid value: ["/nope"]: statat nope: no such file or directory`},
		{"/", 200, `<a href="syslog">syslog</a>`},
		{"/syslog?query=noderun", 406, "path not allowed in query mode"},
	}
	for _, tt := range tests {
		code, body := get(t, s, tt.target)
		if code != tt.code || !strings.Contains(body, tt.contains) || strings.Contains(body, "secret\n") {
			t.Errorf("GET %s: %d %q, want %d containing %q", tt.target, code, body, tt.code, tt.contains)
		}
	}
}

// A service the journal does not hold is read from the kubelet's
// candidate files; with options, the kubelet's note instead.
func TestServiceFiles(t *testing.T) {
	s := New(logRoot(t), WithJournalctl("/nonexistent/journalctl"))
	tests := []struct{ target, want string }{
		{"/?query=svc1", "svc1 plain\n"},
		{"/?query=svc2", "svc2 dot-log\n"},
		{"/?query=svc3", "svc3 in dir\n"},
		{"/?query=svc1&query=svc2", "svc1 plain\nsvc2 dot-log\n"},
		{"/?query=noderun", "\nlog not found for noderun\n"},
		{"/?query=noderun&tailLines=5", "\noptions present and query resolved to log files for [noderun]\ntry without specifying options\n"},
		{"/?query=..", "\nerror getting log for ..: openat ..: path escapes from parent\n"},
	}
	for _, tt := range tests {
		if code, body := get(t, s, tt.target); code != 200 || body != tt.want {
			t.Errorf("GET %s: %d %q, want 200 %q", tt.target, code, body, tt.want)
		}
	}
}

// fakeJournalctl is a journalctl that holds noderun.service and prints the
// arguments of a read, one a line; with HANG set it sleeps instead, its
// PID in the file HANG names.
const fakeJournalctl = `#!/bin/sh
case "$*" in *--field*) echo containerd.service; echo noderun.service; exit 0;; esac
if [ -n "$HANG" ]; then echo $$ > "$HANG"; exec sleep 600; fi
for a in "$@"; do echo "$a"; done
`

func writeFake(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "journalctl")
	must(t, os.WriteFile(p, []byte(fakeJournalctl), 0o755))
	return p
}

// A unit the journal holds is read through journalctl with the kubelet's
// arguments; one it does not, from its file.
func TestServiceJournal(t *testing.T) {
	s := New(logRoot(t), WithJournalctl(writeFake(t), "--directory=/j"))
	code, body := get(t, s, "/?query=noderun&query=svc1&tailLines=3&pattern=x")
	want := "--directory=/j\n--utc\n--no-pager\n--output=short-precise\n--pager-end\n--lines=3\n--unit=noderun\n--grep=x\n" +
		"\noptions present and query resolved to log files for [svc1]\ntry without specifying options\n"
	if code != 200 || body != want {
		t.Errorf("got %d %q, want %q", code, body, want)
	}
}

// A client that goes away ends journalctl.
func TestJournalEndsWithClient(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("HANG", pidFile)
	srv := httptest.NewServer(New(logRoot(t), WithJournalctl(writeFake(t))))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/?query=noderun", nil)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	pid := waitPID(t, pidFile)
	cancel()
	<-done
	// Generous: the bound is not the behaviour, the process's end is.
	for deadline := time.Now().Add(20 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("journalctl (pid %d) still runs after its client went away", pid)
		}
	}
}

func waitPID(t *testing.T, file string) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(file)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
			return pid
		}
	}
	t.Fatal("the fake journalctl never started")
	return 0
}

// journalExport is two units' entries in the journal export format, one a
// minute from 2026-01-01T00:01:00Z, all of one boot.
func journalExport() string {
	var b strings.Builder
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for i := 1; i <= 6; i++ {
		unit := "noderun"
		if i%3 == 0 {
			unit = "containerd"
		}
		b.WriteString("__REALTIME_TIMESTAMP=" + strconv.FormatInt(base+int64(i)*60e6, 10) + "\n" +
			"__MONOTONIC_TIMESTAMP=" + strconv.Itoa(i*1e6) + "\n_BOOT_ID=0123456789abcdef0123456789abcdef\n_HOSTNAME=node1\n" +
			"_SYSTEMD_UNIT=" + unit + ".service\nSYSLOG_IDENTIFIER=" + unit + "\n_PID=42\nPRIORITY=6\n" +
			"MESSAGE=line " + strconv.Itoa(i) + " from " + unit + "\n\n")
	}
	return b.String()
}

// The real journalctl reads a real journal file (made by
// systemd-journal-remote from export text) with the arguments built from
// every parameter: the unit, the time window, the pattern, the tail and
// the boot select the entries the kubelet's query would.
func TestRealJournal(t *testing.T) {
	const remote = "/usr/lib/systemd/systemd-journal-remote"
	jctl, err := exec.LookPath("journalctl")
	testenv.Require(t, err == nil, "journalctl (apt-get install systemd)")
	_, err = os.Stat(remote)
	testenv.Require(t, err == nil, remote+" to write a journal file (apt-get install systemd-journal-remote)")
	dir := t.TempDir()
	export, file := filepath.Join(dir, "export.txt"), filepath.Join(dir, "test.journal")
	must(t, os.WriteFile(export, []byte(journalExport()), 0o644))
	if out, err := exec.Command(remote, "-o", file, export).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", remote, err, out)
	}
	s := New(logRoot(t), WithJournalctl(jctl, "--file="+file))
	tests := []struct {
		query string
		want  []string
	}{
		{"query=noderun", []string{"line 1 from noderun", "line 2 from noderun", "line 4 from noderun", "line 5 from noderun"}},
		{"query=noderun&query=containerd&tailLines=2", []string{"line 5 from noderun", "line 6 from containerd"}},
		{"query=noderun&sinceTime=2026-01-01T00:01:30Z&untilTime=2026-01-01T01:04:30%2B01:00", []string{"line 2 from noderun", "line 4 from noderun"}},
		{"query=noderun&pattern=line%20[15]&boot=0", []string{"line 1 from noderun", "line 5 from noderun"}},
		{"query=containerd&boot=-1", nil},
	}
	for _, tt := range tests {
		code, body := get(t, s, "/?"+tt.query)
		var got []string
		for _, l := range strings.Split(body, "\n") {
			if i := strings.Index(l, "line "); i >= 0 && strings.Contains(l, "node1 ") {
				got = append(got, l[i:])
			}
		}
		if code != 200 || strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("%s: %d %q, want the entries %q", tt.query, code, body, tt.want)
		}
	}
}

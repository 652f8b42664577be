package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"
)

// talkerPod logs its runs: the first waits for /d/go, which the test makes
// with kubectl exec, then ends and is restarted; the second stays.
const talkerPod = `apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: d
    emptyDir: {}
  containers:
  - name: main
    image: busybox:1.36
    volumeMounts:
    - {name: d, mountPath: /d}
    command:
    - sh
    - -c
    - |
      n=$(cat /d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /d/n
      echo "run $n start"
      echo "run $n to stderr" >&2
      if [ $n -ge 2 ]; then sleep 1; echo "run $n last"; exec sleep 3600; fi
      echo "run $n waiting"
      while [ ! -f /d/go ]; do sleep 0.2; done
      echo "run $n end"
`

// syncBuffer collects a command's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// kubectl logs -f follows a run and ends with it; logs -p shows the run
// before; kubectl exec carries stdin and returns the command's exit code;
// the view token reads logs but cannot exec; noderun logs and exec do the
// same without kubectl.
func TestKubectlLogsAndExec(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	n.writeManifest("talker.yaml", talkerPod)
	n.waitPod("talker", "Running", running)
	pod := "talker-" + nodeName

	buildKubectl(t) // before the clock starts: a cold build takes minutes
	follow := n.kubectlCmd(stepContext(t), view, "logs", "-f", pod)
	out := &syncBuffer{}
	follow.Stdout, follow.Stderr = out, out
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followed := make(chan error, 1)
	go func() { followed <- follow.Wait() }()
	waitUntil(t, "kubectl logs -f to show the first run", func() bool { return strings.Contains(out.String(), "run 1 waiting") })
	select {
	case err := <-followed:
		t.Fatalf("kubectl logs -f ended while the container runs: %v\n%s", err, out.String())
	default:
	}

	if o, e, err := n.kubectl(admin, "exec", pod, "--", "touch", "/d/go"); err != nil {
		t.Fatalf("kubectl exec touch: %v\n%s%s", err, o, e)
	}
	select {
	case err := <-followed:
		if err != nil {
			t.Fatalf("kubectl logs -f: %v\n%s", err, out.String())
		}
	case <-time.After(waitTimeout):
		t.Fatalf("kubectl logs -f did not end with the container:\n%s", out.String())
	}
	// stdout and stderr are two pipes: their lines interleave either way.
	if got := out.String(); !strings.HasSuffix(got, "run 1 end\n") || !strings.Contains(got, "run 1 start\n") ||
		!strings.Contains(got, "run 1 to stderr\n") || strings.Count(got, "\n") != 4 {
		t.Errorf("kubectl logs -f printed %q, want run 1's four lines, its end last", got)
	}

	n.waitPod("talker", "restarted and running", func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	waitUntil(t, "the second run's log", func() bool {
		o, _, _ := n.kubectl(view, "logs", pod)
		return strings.Contains(o, "run 2 last")
	})
	if o, e, err := n.kubectl(view, "logs", "-p", pod); err != nil || !strings.Contains(o, "run 1 end") || strings.Contains(o, "run 2") {
		t.Errorf("kubectl logs -p: %v, %q %s; want the first run's log", err, o, e)
	}
	if o, e, err := n.kubectl(view, "logs", "--tail=1", "--timestamps", pod); err != nil || !regexp.MustCompile(`^\S+Z run 2 last\n$`).MatchString(o) {
		t.Errorf("kubectl logs --tail=1 --timestamps: %v, %q %s", err, o, e)
	}

	// Exit codes and stdin.
	if o, e, err := n.kubectl(admin, "exec", pod, "--", "sh", "-c", "echo out; echo err >&2; exit 7"); exitCode(err) != 7 || o != "out\n" || !strings.Contains(e, "err\n") {
		t.Errorf("kubectl exec exit 7: exit %d, stdout %q, stderr %q", exitCode(err), o, e)
	}
	cmd := n.kubectlCmd(stepContext(t), admin, "exec", "-i", pod, "--", "sh", "-c", "tr a-z A-Z; echo done")
	cmd.Stdin = strings.NewReader("hello\n")
	if o, err := cmd.Output(); err != nil || string(o) != "HELLO\ndone\n" {
		t.Errorf("kubectl exec -i: %v, %q; want \"HELLO\\ndone\\n\"", err, o)
	}

	// With -it on a terminal, kubectl and noderun exec give the command a
	// terminal of the client's size.
	for _, c := range []struct {
		name string
		cmd  *exec.Cmd
	}{
		{"kubectl", n.kubectlCmd(stepContext(t), admin, "exec", "-it", pod, "--", "sh", "-c", "stty size; [ -t 0 ] && echo tty; exit 5")},
		{"noderun", exec.CommandContext(stepContext(t), noderunBin, "--state-dir", n.state, "--run-dir", n.run,
			"exec", "-it", pod, "--", "sh", "-c", "stty size; [ -t 0 ] && echo tty; exit 5")},
	} {
		out, code := runOnTerminal(t, c.cmd, 33, 101)
		if code != 5 || !strings.Contains(out, "33 101\r\ntty\r\n") {
			t.Errorf("%s exec -it: exit %d, output %q; want 5 and \"33 101\\r\\ntty\\r\\n\"", c.name, code, out)
		}
	}

	// kubectl attach shows what the container writes from now on.
	attach := n.kubectlCmd(stepContext(t), admin, "attach", pod)
	attached := &syncBuffer{}
	attach.Stdout, attach.Stderr = attached, attached
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "kubectl attach to show new output", func() bool {
		n.kubectl(admin, "exec", pod, "--", "sh", "-c", "echo attached > /proc/1/fd/1")
		return strings.Contains(attached.String(), "attached\n")
	})
	attach.Process.Kill()
	attach.Wait()
	if strings.Contains(attached.String(), "run 2") {
		t.Errorf("kubectl attach showed output from before it attached: %q", attached.String())
	}

	// An exec whose client goes is killed.
	execCtx, endExec := context.WithCancel(stepContext(t))
	long := n.kubectlCmd(execCtx, admin, "exec", pod, "--", "sleep", "300")
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	ps := func() string {
		o, _, _ := n.kubectl(admin, "exec", pod, "--", "ps", "-o", "args")
		return o
	}
	waitUntil(t, "the exec to run", func() bool { return strings.Contains(ps(), "sleep 300") })
	endExec()
	long.Wait()
	waitUntil(t, "the exec to end with its client", func() bool { return !strings.Contains(ps(), "sleep 300") })

	// The view token may read, not exec.
	if _, e, err := n.kubectl(view, "exec", pod, "--", "true"); err == nil || !strings.Contains(e, "forbidden") {
		t.Errorf("kubectl exec with the view token: %v, %s; want forbidden", err, e)
	}

	// noderun's own logs and exec, through the same API.
	noderun := func(stdin string, args ...string) (string, int) {
		c := exec.CommandContext(stepContext(t), noderunBin, append([]string{"--state-dir", n.state, "--run-dir", n.run}, args...)...)
		c.Stdin = strings.NewReader(stdin)
		o, err := n.runBounded(c, waitTimeout/2)
		return o, exitCode(err)
	}
	if o, code := noderun("", "logs", "-p", pod); code != 0 || !strings.Contains(o, "run 1 end") {
		t.Errorf("noderun logs -p: exit %d, %q", code, o)
	}
	// The last line is what the attach test wrote to the container's stdout.
	if o, code := noderun("", "logs", "--tail", "1", pod); code != 0 || o != "attached\n" {
		t.Errorf("noderun logs --tail 1: exit %d, %q", code, o)
	}
	if o, code := noderun("abc", "exec", "-i", pod, "--", "sh", "-c", "cat; exit 3"); code != 3 || o != "abc" {
		t.Errorf("noderun exec: exit %d, %q; want 3, \"abc\"", code, o)
	}
	if o, code := noderun("", "exec", "missing-pod", "--", "true"); code == 0 || !strings.Contains(o, `pods "missing-pod" not found`) {
		t.Errorf("noderun exec in a missing pod: exit %d, %q", code, o)
	}
}

// kubectl port-forward carries HTTP requests to a server in the pod that
// listens on the pod's loopback only.
func TestKubectlPortForward(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	n.writeManifest("web.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: busybox:1.36
    command: ["sh", "-c", "mkdir /www && echo hello through the tunnel > /www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /www"]
`)
	n.waitPod("web", "Running", running)
	pod := "web-" + nodeName

	buildKubectl(t) // before the clock starts: a cold build takes minutes
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	cmd := n.kubectlCmd(ctx, admin, "port-forward", "pod/"+pod, ":8080")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut := &syncBuffer{}
	cmd.Stderr = errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		cmd.Wait()
	}()
	// "Forwarding from 127.0.0.1:PORT -> 8080"
	local := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 8080`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				local <- m[1]
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	var addr string
	select {
	case addr = <-local:
	case <-time.After(waitTimeout):
		t.Fatalf("kubectl port-forward did not start: %s", errOut.String())
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	var lastErr error
	defer func() {
		if t.Failed() {
			t.Logf("the last request's error: %v; kubectl port-forward's stderr: %s", lastErr, errOut.String())
		}
	}()
	for i := range 3 { // each request is a new forwarded connection
		var body []byte
		// The kubectl command's own bound: a busy machine slows each
		// forwarded connection's setup, and a request may hit its 10 s.
		waitUntilFor(t, "an answer through the tunnel", 2*waitTimeout, func() bool {
			resp, err := hc.Get("http://" + addr + "/index.html")
			if lastErr = err; err != nil {
				return false // httpd may not listen yet
			}
			defer resp.Body.Close()
			body, _ = io.ReadAll(resp.Body)
			return resp.StatusCode == http.StatusOK
		})
		if string(body) != "hello through the tunnel\n" {
			t.Fatalf("request %d: got %q", i, body)
		}
	}

	if _, e, err := n.kubectl(view, "port-forward", "pod/"+pod, ":8080"); err == nil || !strings.Contains(e, "forbidden") {
		t.Errorf("kubectl port-forward with the view token: %v, %s; want forbidden", err, e)
	}
}

// runOnTerminal runs cmd with a new pseudo-terminal of rows x cols as its
// stdin, stdout and stderr, and returns what it wrote and its exit code.
func runOnTerminal(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (string, int) {
	t.Helper()
	ptmx, out, wait := startOnTerminal(t, cmd, rows, cols)
	defer ptmx.Close()
	code := wait()
	return out.String(), code
}

// startOnTerminal starts cmd with a new pseudo-terminal of rows x cols as
// its stdin, stdout and stderr. It returns the terminal's other end (what
// is written to it is typed), what cmd writes, and the wait for cmd's
// exit code, which returns once its output was read.
func startOnTerminal(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (*os.File, *syncBuffer, func() int) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close() // the child has it
	out := &syncBuffer{}
	copied := make(chan struct{})
	go func() {
		io.Copy(out, ptmx) // ends with EIO once the child's side is closed
		close(copied)
	}()
	return ptmx, out, func() int {
		err := cmd.Wait()
		select {
		case <-copied:
		case <-time.After(5 * time.Second):
		}
		return exitCode(err)
	}
}

// kubectl logs reads the rotated files too, the gzipped one included, in
// order, and --tail counts across them.
func TestKubectlLogsAcrossRotation(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--container-log-max-size", "8Ki", "--container-log-max-files", "3")
	view := n.kubeconfig(false)
	n.writeManifest("chatty.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: chatty
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    # 100 lines (6 KiB) a second: at most one rotation in a second.
    command: ["sh", "-c", 'i=0; while [ $i -lt 600 ]; do echo "line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; i=$((i+1)); [ $((i % 100)) -eq 0 ] && sleep 1.1; done; echo done; sleep 3600']
`)
	p := n.waitPod("chatty", "Running", running)
	path := n.logPath(p, "main", 0)
	n.waitLogLine(path, "done")
	waitUntil(t, "a plain and a gzipped rotated log", func() bool {
		all, _ := filepath.Glob(path + ".*")
		gz, _ := filepath.Glob(path + ".*.gz")
		return len(all) == 2 && len(gz) == 1
	})
	current := len(n.readLog(path))
	pod := "chatty-" + nodeName
	o, e, err := n.kubectl(view, "logs", pod)
	if err != nil {
		t.Fatalf("kubectl logs: %v %s", err, e)
	}
	lines := strings.Split(strings.TrimSuffix(o, "\n"), "\n")
	if len(lines) <= current || lines[len(lines)-1] != "done" {
		t.Fatalf("kubectl logs: %d lines ending %q; want more than the current file's %d, ending with done", len(lines), lines[len(lines)-1], current)
	}
	// The lines kept are the last ones, in order, with no gap.
	var first int
	if _, err := fmt.Sscanf(lines[0], "line %d", &first); err != nil {
		t.Fatalf("first line %q", lines[0])
	}
	for i, l := range lines[:len(lines)-1] {
		if want := fmt.Sprintf("line %d ", first+i); !strings.HasPrefix(l, want) {
			t.Fatalf("line %d is %q, want it to start with %q", i, l, want)
		}
	}
	if o, _, err := n.kubectl(view, "logs", "--tail", strconv.Itoa(current+5), pod); err != nil || strings.Count(o, "\n") != current+5 {
		t.Errorf("kubectl logs --tail %d: %v, %d lines", current+5, err, strings.Count(o, "\n"))
	}
}

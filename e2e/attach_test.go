package e2e

import (
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// attachPod has a terminal with stdin (a shell), a container without
// either, a stdin without a terminal that echoes what it reads, and a
// stdinOnce one that ends at its stdin's EOF.
const attachPod = `apiVersion: v1
kind: Pod
metadata:
  name: attach
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: shell
    image: busybox:1.36
    tty: true
    stdin: true
    command: ["sh", "-c", "if [ -t 0 ] && [ -t 1 ]; then echo is a tty; else echo no tty; fi; echo $TERM; exec sh"]
  - name: plain
    image: busybox:1.36
    command: ["sh", "-c", "if [ -t 0 ] || [ -t 1 ]; then echo is a tty; else echo no tty; fi; exec sleep 3600"]
  - name: echo
    image: busybox:1.36
    stdin: true
    command: ["sh", "-c", "while read l; do echo \"got $l\"; done; echo saw EOF; exec sleep 3600"]
  - name: once
    image: busybox:1.36
    stdin: true
    stdinOnce: true
    command: ["sh", "-c", "while read l; do echo \"once $l\"; done; echo saw EOF; exit 3"]
`

// A tty container's process has a terminal, and its log is the kubelet's
// (all stdout, lines without their "\r\n"); a container without one has
// none. kubectl attach -i carries input to a container's open stdin, which
// an attach's end leaves open, unless stdinOnce: then the container reads
// EOF and restarts. attach -it drives the shell on a real terminal, resized
// to the client's. The view token may not attach.
func TestKubectlAttach(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	admin, view := n.kubeconfig(true), n.kubeconfig(false)
	n.writeManifest("attach.yaml", attachPod)
	p := n.waitPod("attach", "Running", running)
	pod := "attach-" + nodeName

	// The terminal, as the process and the log see it.
	n.waitLogLine(n.logPath(p, "shell", 0), "is a tty")
	n.waitLogLine(n.logPath(p, "plain", 0), "no tty")
	for _, l := range n.readLog(n.logPath(p, "shell", 0)) {
		if l.stream != "stdout" || strings.ContainsAny(l.content, "\r\n") {
			t.Errorf("tty log record %+v: want stdout without \\r or \\n", l)
		}
	}
	if o, e, err := n.kubectl(view, "logs", pod, "-c", "shell"); err != nil || !strings.HasPrefix(o, "is a tty\nxterm\n") {
		t.Errorf("kubectl logs of the tty container: %v, %q %s", err, o, e)
	}

	buildKubectl(t) // before the clock starts

	// attach -i: what it sends comes back; its end leaves stdin open.
	out, code := attachWithInput(t, n.kubectlCmd(stepContext(t), admin, "attach", "-i", pod, "-c", "echo"), "hello", "got hello")
	if code != 0 {
		t.Errorf("kubectl attach -i: exit %d, %q", code, out)
	}
	if o, _, _ := n.kubectl(view, "logs", pod, "-c", "echo"); strings.Contains(o, "saw EOF") {
		t.Errorf("the end of an attach closed the container's stdin: %q", o)
	}
	out, _ = attachWithInput(t, n.kubectlCmd(stepContext(t), admin, "attach", "-i", pod, "-c", "echo"), "again", "got again")
	if st := containerStatus(n.pod("attach"), "echo"); st == nil || st.RestartCount != 0 || st.State.Running == nil {
		t.Errorf("echo after two attaches: %+v, want its first run still running", st)
	}

	// noderun attach does the same without kubectl.
	attachWithInput(t, exec.CommandContext(stepContext(t), noderunBin, "--state-dir", n.state, "--run-dir", n.run, "attach", "-i", "-c", "echo", pod),
		"from noderun", "got from noderun")

	// stdinOnce: the first attach's end is the container's EOF; the
	// attach shows the output up to the container's end.
	out, code = attachWithInput(t, n.kubectlCmd(stepContext(t), admin, "attach", "-i", pod, "-c", "once"), "first", "once first")
	if !strings.Contains(out, "saw EOF") {
		t.Errorf("kubectl attach -i to the stdinOnce container: exit %d, %q; want its output up to \"saw EOF\"", code, out)
	}
	p = n.waitPod("attach", "once restarted", func(p *v1.Pod) bool {
		st := containerStatus(p, "once")
		return st != nil && st.RestartCount == 1 && st.State.Running != nil
	})
	if st := containerStatus(p, "once"); st.LastTerminationState.Terminated == nil || st.LastTerminationState.Terminated.ExitCode != 3 {
		t.Errorf("once's last state %+v, want exit code 3", st.LastTerminationState)
	}
	// The restart has a new, open stdin, which this attach closes too;
	// in the crash backoff that follows, the container does not run and
	// an attach gets the kubelet's answer.
	attachWithInput(t, n.kubectlCmd(stepContext(t), admin, "attach", "-i", pod, "-c", "once"), "second", "once second")
	n.waitPod("attach", "once in its crash backoff", func(p *v1.Pod) bool {
		st := containerStatus(p, "once")
		return st != nil && st.State.Waiting != nil && st.State.Waiting.Reason == "CrashLoopBackOff"
	})
	if _, e, err := n.kubectl(admin, "attach", pod, "-c", "once"); err == nil || !strings.Contains(e, `container not found ("once")`) {
		t.Errorf("kubectl attach to a container in its backoff: %v, %s; want the kubelet's container not found", err, e)
	}

	// A restarted noderun leaves stdin open, and attaches to it again.
	n.stop()
	n.start()
	n.waitHealthy()
	admin, view = n.kubeconfig(true), n.kubeconfig(false) // its API's new port
	n.waitPod("attach", "adopted", func(p *v1.Pod) bool {
		st := containerStatus(p, "echo")
		return st != nil && st.State.Running != nil
	})
	attachWithInput(t, n.kubectlCmd(stepContext(t), admin, "attach", "-i", pod, "-c", "echo"), "after restart", "got after restart")
	if o, _, _ := n.kubectl(view, "logs", pod, "-c", "echo"); strings.Contains(o, "saw EOF") {
		t.Errorf("a noderun restart closed the container's stdin: %q", o)
	}

	// attach -it: the shell on the client's terminal, at its size; its
	// exit ends the attach, and the restart has a terminal again.
	ptmx, tout, wait := startOnTerminal(t, n.kubectlCmd(stepContext(t), admin, "attach", "-it", pod, "-c", "shell"), 33, 101)
	defer ptmx.Close()
	waitUntil(t, "the shell to answer through attach -it", func() bool {
		io.WriteString(ptmx, "echo $((6*7))\r")
		return strings.Contains(tout.String(), "42\r\n")
	})
	// The prompt, an unfinished line no log record holds yet, shows at once
	// (with busybox's query for the cursor's position, which a terminal
	// would answer).
	prompted := func() bool { return strings.HasSuffix(strings.TrimSuffix(tout.String(), "\x1b[6n"), "/ # ") }
	for deadline := time.Now().Add(waitTimeout); !prompted(); time.Sleep(pollEvery) {
		if time.Now().After(deadline) {
			t.Fatalf("attach -it did not show the shell's prompt: %q", tout.String())
		}
	}
	waitUntil(t, "the shell's terminal to have the client's size", func() bool {
		io.WriteString(ptmx, "stty size\r")
		return strings.Contains(tout.String(), "33 101\r\n")
	})
	io.WriteString(ptmx, "exit 4\r")
	if code := wait(); code != 0 {
		t.Errorf("kubectl attach -it: exit %d after the shell's exit, %q", code, tout.String())
	}
	p = n.waitPod("attach", "shell restarted", func(p *v1.Pod) bool {
		st := containerStatus(p, "shell")
		return st != nil && st.RestartCount == 1 && st.State.Running != nil
	})
	n.waitLogLine(n.logPath(p, "shell", 1), "is a tty")
	if o, e, err := n.kubectl(view, "logs", "-p", pod, "-c", "shell"); err != nil || !strings.Contains(o, "\n42\n") {
		t.Errorf("kubectl logs -p of the shell: %v, %q %s; want the attach's \"42\" line", err, o, e)
	}

	// The view token may read, not attach.
	if _, e, err := n.kubectl(view, "attach", pod, "-c", "plain"); err == nil || !strings.Contains(e, "forbidden") {
		t.Errorf("kubectl attach with the view token: %v, %s; want forbidden", err, e)
	}
}

// attachWithInput runs an attach -i whose stdin sends line until the
// attach shows want, then ends; it returns the attach's output and exit
// code.
func attachWithInput(t *testing.T, cmd *exec.Cmd, line, want string) (string, int) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The attach shows output from when it took hold: send until the
	// answer to one shows.
	deadline := time.Now().Add(waitTimeout)
	for io.WriteString(in, line+"\n"); !strings.Contains(out.String(), want); io.WriteString(in, line+"\n") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s did not show %q: %q", cmd.Args, want, out.String())
		}
		time.Sleep(pollEvery)
	}
	in.Close()
	err = cmd.Wait()
	return out.String(), exitCode(err)
}

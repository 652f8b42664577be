package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/manifests"
)

// fakeNode is a running node's engine, as both APIs read it.
type fakeNode struct {
	pods   []v1.Pod
	events []v1.Event
}

func (f *fakeNode) Healthy(context.Context) error      { return nil }
func (f *fakeNode) Pods() []v1.Pod                     { return slices.Clone(f.pods) }
func (f *fakeNode) Events() []v1.Event                 { return slices.Clone(f.events) }
func (f *fakeNode) Changes() (uint64, <-chan struct{}) { return 1, nil }
func (f *fakeNode) Node(context.Context) *v1.Node      { return &v1.Node{} }
func (f *fakeNode) SourceErrors() map[string][]error   { return nil }
func (f *fakeNode) Sources() []manifests.SourceInfo    { return nil }
func (f *fakeNode) LogStreams(context.Context) ([]crilog.StreamStats, error) {
	return nil, nil
}

// fakeStreams answers a pod's log with the query it was asked.
type fakeStreams struct{}

func (fakeStreams) Exec(w http.ResponseWriter, _ *http.Request, _, _ string) {
	http.Error(w, "no exec here", http.StatusNotImplemented)
}

func (fakeStreams) Log(w http.ResponseWriter, r *http.Request, ns, pod string) {
	fmt.Fprintf(w, "log of %s/%s: %s\n", ns, pod, r.URL.RawQuery)
}
func (fakeStreams) Attach(w http.ResponseWriter, _ *http.Request, _, _ string)      {}
func (fakeStreams) PortForward(w http.ResponseWriter, _ *http.Request, _, _ string) {}

// serveNode serves both APIs of node from fresh state and run dirs, as a
// running noderun does, and returns the flags that find them.
func serveNode(t *testing.T, node *fakeNode) []string {
	state, run := t.TempDir(), t.TempDir()
	creds, err := kubeapi.LoadCredentials(kubeapi.CredentialsDir(state), kubeapi.Hosts("127.0.0.1"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := kubeapi.New(creds)
	srv.Ready(node, fakeStreams{})
	l, err := kubeapi.Listen("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := srv.Serve(l)
	t.Cleanup(func() { stop() })
	if err := os.WriteFile(kubeapi.ServerFile(run), []byte(kubeapi.ServerURL(l.Addr())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	status, stopStatus, err := kubeapi.ServeStatus(kubeapi.StatusSocket(run), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	status.Ready(node)
	t.Cleanup(func() { stopStatus() })
	return []string{"--state-dir", state, "--run-dir", run}
}

// runClient runs `noderun args...` in-process with the client commands and
// the main command's flags they read.
func runClient(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{Name: "noderun", Commands: Commands(), Writer: &out, ErrWriter: &errOut, Flags: []cli.Flag{
		&cli.StringFlag{Name: "state-dir"}, &cli.StringFlag{Name: "run-dir"}, &cli.StringFlag{Name: "status-socket"},
	}}
	err = app.RunContext(context.Background(), append([]string{"noderun"}, args...))
	return out.String(), errOut.String(), err
}

func testNode() *fakeNode {
	// Minutes ago, so the age printed holds on a slow machine.
	start := metav1.NewTime(time.Now().Add(-10 * time.Minute))
	return &fakeNode{
		pods: []v1.Pod{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-n1", UID: "u1"},
			Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "nginx:1.29"}}},
			Status: v1.PodStatus{Phase: v1.PodPending, StartTime: &start, PodIP: "10.0.0.7", PodIPs: []v1.PodIP{{IP: "10.0.0.7"}},
				ContainerStatuses: []v1.ContainerStatus{{Name: "app", RestartCount: 2,
					State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}},
		}},
		events: []v1.Event{{
			ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: "web-n1.1"},
			InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-n1", UID: "u1"},
			Reason:         "BackOff", Message: "Back-off restarting failed container", Type: "Warning", Count: 1,
			FirstTimestamp: start, LastTimestamp: start,
		}},
	}
}

// `noderun pods` prints the API's pod printer from the status socket: the
// columns of `kubectl get pods -A` and the IP.
func TestPodsCommand(t *testing.T) {
	flags := serveNode(t, testNode())
	out, _, err := runClient(t, append(flags, "pods")...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !slices.Equal(strings.Fields(lines[0]), []string{"NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"}) {
		t.Fatalf("output:\n%s", out)
	}
	if got, want := strings.Fields(lines[1]), []string{"default", "web-n1", "0/1", "CrashLoopBackOff", "2", "10m", "10.0.0.7"}; !slices.Equal(got, want) {
		t.Errorf("row %q, want %q", got, want)
	}
	if _, _, err := runClient(t, "--status-socket", t.TempDir()+"/none.sock", "pods"); err == nil || !strings.Contains(err.Error(), "is noderun running?") {
		t.Errorf("no socket: %v, want the hint", err)
	}
}

func TestEventsAndDescribe(t *testing.T) {
	flags := serveNode(t, testNode())
	out, _, err := runClient(t, append(flags, "events", "--for", "web-n1")...)
	if err != nil || !strings.Contains(out, "REASON") || !strings.Contains(out, "BackOff") || !strings.Contains(out, "pod/web-n1") {
		t.Errorf("events: %v\n%s", err, out)
	}
	_, errOut, err := runClient(t, append(flags, "events", "-n", "edge")...)
	if err != nil || errOut != "No events found.\n" {
		t.Errorf("no events: %v, stderr %q", err, errOut)
	}
	out, _, err = runClient(t, append(flags, "describe", "web-n1")...)
	for _, want := range []string{"Name:         web-n1", "Reason:       CrashLoopBackOff", "Restart Count:  2", "Warning  BackOff"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("describe: %v, no %q in\n%s", err, want, out)
		}
	}
	if _, _, err := runClient(t, append(flags, "describe", "nosuch")...); err == nil || err.Error() != `pods "nosuch" not found` {
		t.Errorf("describe nosuch: %v, want the API's Status message", err)
	}
}

func TestLogsCommand(t *testing.T) {
	flags := serveNode(t, testNode())
	out, _, err := runClient(t, append(flags, "logs", "-c", "app", "--tail", "3", "web-n1")...)
	if err != nil || out != "log of default/web-n1: container=app&tailLines=3\n" {
		t.Errorf("logs: %v, %q", err, out)
	}
}

// Without a running node the commands say so, and kubeconfig how to do
// without one.
func TestNotRunning(t *testing.T) {
	flags := []string{"--state-dir", t.TempDir(), "--run-dir", t.TempDir()}
	for _, args := range [][]string{{"events"}, {"logs", "web"}, {"describe", "web"}, {"exec", "web", "--", "true"}, {"kubeconfig"}} {
		_, _, err := runClient(t, append(flags, args...)...)
		if err == nil || !strings.Contains(err.Error(), "noderun is not running") {
			t.Errorf("%q: %v", args, err)
		}
	}
	if _, _, err := runClient(t, append(flags, "kubeconfig")...); err == nil || !strings.Contains(err.Error(), "give --server") {
		t.Errorf("kubeconfig: %v, want the --server hint", err)
	}
}

// A pod rejected at admission: describe shows its reason and message, as
// kubectl, and no state for containers that have no status; pods shows
// the reason in STATUS.
func TestDescribeRejectedPod(t *testing.T) {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "big-n1", Namespace: "default", UID: "u2"},
		Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "main", Image: "busybox"}}},
		Status: v1.PodStatus{Phase: v1.PodFailed, Reason: "OutOfcpu",
			Message: "Pod was rejected: Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000"}}
	flags := serveNode(t, &fakeNode{pods: []v1.Pod{p}})
	out, _, err := runClient(t, append(flags, "describe", "big-n1")...)
	for _, want := range []string{"Status:       Failed", "Reason:       OutOfcpu",
		"Message:      Pod was rejected: Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("describe: %v, no %q in\n%s", err, want, out)
		}
	}
	if strings.Contains(out, "State:") || strings.Contains(out, "Restart Count:") {
		t.Errorf("describe shows a state for a container without status:\n%s", out)
	}
	out, _, err = runClient(t, append(flags, "pods")...)
	if err != nil || !strings.Contains(out, "OutOfcpu") {
		t.Errorf("pods: %v\n%s", err, out)
	}
}

package prober

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// fakeExec answers exec probes and hooks and remembers what it was asked.
type fakeExec struct {
	out      string
	code     int
	timedOut bool
	err      error

	cmd      []string
	id       string
	timeout  time.Duration
	deadline time.Duration // left on the context when called
}

func (f *fakeExec) exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int, bool, error) {
	f.cmd, f.id, f.timeout = cmd, id, timeout
	if dl, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(dl)
	}
	return []byte(f.out), f.code, f.timedOut, f.err
}

func execHandler(cmd ...string) *v1.ProbeHandler {
	return &v1.ProbeHandler{Exec: &v1.ExecAction{Command: cmd}}
}

func TestExecProbe(t *testing.T) {
	errNoTask := errors.New("no running task")
	long := strings.Repeat("x", 12<<10)
	for _, tc := range []struct {
		name    string
		fake    fakeExec
		want    Result
		wantMsg string
		wantErr error
	}{
		{"exit 0", fakeExec{out: "fine\n"}, Success, "fine\n", nil},
		// The kubelet's message is the command's output, nothing else.
		{"exit 1", fakeExec{out: "cat: can't open '/tmp/healthy': No such file or directory\n", code: 1},
			Failure, "cat: can't open '/tmp/healthy': No such file or directory\n", nil},
		{"exit 1 without output", fakeExec{code: 1}, Failure, "", nil},
		{"output cut at 10 KiB", fakeExec{out: long, code: 2}, Failure, long[:10<<10], nil},
		// The CRI client's words for a timed-out ExecSync (k8s.io/cri-client).
		{"timeout", fakeExec{timedOut: true, code: 137}, Failure, `command timed out: "cat /tmp/healthy" timed out after 1s`, nil},
		{"runtime error", fakeExec{err: errNoTask}, Unknown, "", errNoTask},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake
			tgt := Target{ContainerID: "c1", Container: &v1.Container{Name: "app"}}
			res, msg, err := Do(context.Background(), execHandler("cat", "/tmp/healthy"), time.Second, tgt, f.exec)
			if res != tc.want || msg != tc.wantMsg || !errors.Is(err, tc.wantErr) {
				t.Errorf("got %v %.40q %v, want %v %.40q %v", res, msg, err, tc.want, tc.wantMsg, tc.wantErr)
			}
			if f.id != "c1" || f.timeout != time.Second {
				t.Errorf("exec in %q with timeout %s, want c1 and 1s", f.id, f.timeout)
			}
			// The runtime kills at the timeout; the context only bounds a
			// runtime that does not answer.
			if f.deadline < 10*time.Second || f.deadline > execGrace+time.Second {
				t.Errorf("context deadline in %s, want the timeout plus %s", f.deadline, execGrace)
			}
		})
	}
}

func TestExecProbeExpandsStaticEnv(t *testing.T) {
	c := &v1.Container{Name: "app", Env: []v1.EnvVar{
		{Name: "FILE", Value: "/tmp/first"},
		{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "FILE", Value: "/tmp/healthy"}, // the last definition wins
		{Name: "REF", Value: "$(FILE)"},       // values are not expanded in turn
	}}
	for _, tc := range []struct{ in, want string }{
		{"$(FILE)", "/tmp/healthy"},
		{"-f=$(FILE).d", "-f=/tmp/healthy.d"},
		{"$(POD)", ""}, // valueFrom: the kubelet knows only literal values
		{"$(REF)", "$(FILE)"},
		{"$(HOSTNAME)", "$(HOSTNAME)"}, // unknown: left as written
		{"$$(FILE)", "$(FILE)"},
		{"$FILE", "$FILE"},
	} {
		f := &fakeExec{}
		if _, _, err := Do(context.Background(), execHandler("sh", tc.in), time.Second, Target{Container: c}, f.exec); err != nil {
			t.Fatal(err)
		}
		if got := f.cmd[1]; got != tc.want {
			t.Errorf("%q expanded to %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestResolvePort(t *testing.T) {
	c := &v1.Container{Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}}}
	for _, tc := range []struct {
		port    intstr.IntOrString
		want    int
		wantErr string
	}{
		{intstr.FromInt32(80), 80, ""},
		{intstr.FromString("http"), 8080, ""},
		{intstr.FromString("metrics"), 9090, ""},
		{intstr.FromString("8443"), 8443, ""}, // a number written as a string
		{intstr.FromString("grpc"), -1, `strconv.Atoi: parsing "grpc": invalid syntax`},
		{intstr.FromInt32(0), 0, "invalid port number: 0"},
		{intstr.FromInt32(65536), 65536, "invalid port number: 65536"},
		{intstr.FromString("70000"), 70000, "invalid port number: 70000"},
	} {
		got, err := resolvePort(tc.port, c)
		if got != tc.want || errString(err) != tc.wantErr {
			t.Errorf("resolvePort(%s) = %d, %v; want %d, %q", tc.port.String(), got, err, tc.want, tc.wantErr)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// listen opens a TCP listener on addr ("127.0.0.1:0") and returns it with
// its port.
func listen(t *testing.T, addr string) (net.Listener, int) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// closedPort is a port nothing listens on.
func closedPort(t *testing.T) int {
	l, port := listen(t, "127.0.0.1:0")
	l.Close()
	return port
}

func TestTCPProbe(t *testing.T) {
	_, open := listen(t, "127.0.0.1:0")
	closed := closedPort(t)
	c := &v1.Container{Name: "app", Ports: []v1.ContainerPort{{Name: "svc", ContainerPort: int32(open)}}}
	for _, tc := range []struct {
		name    string
		podIP   string
		action  v1.TCPSocketAction
		want    Result
		wantMsg string
		wantErr string
	}{
		{"open", "127.0.0.1", v1.TCPSocketAction{Port: intstr.FromInt(open)}, Success, "", ""},
		{"named port", "127.0.0.1", v1.TCPSocketAction{Port: intstr.FromString("svc")}, Success, "", ""},
		// TEST-NET-1 as the pod's address: only the host field can make it work.
		{"host field", "192.0.2.1", v1.TCPSocketAction{Host: "127.0.0.1", Port: intstr.FromInt(open)}, Success, "", ""},
		{"closed", "127.0.0.1", v1.TCPSocketAction{Port: intstr.FromInt(closed)}, Failure,
			"dial tcp 127.0.0.1:" + strconv.Itoa(closed) + ": connect: connection refused", ""},
		{"unknown port name", "127.0.0.1", v1.TCPSocketAction{Port: intstr.FromString("web")}, Unknown, "",
			`strconv.Atoi: parsing "web": invalid syntax`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, msg, err := Do(context.Background(), &v1.ProbeHandler{TCPSocket: &tc.action}, passTimeout, Target{PodIP: tc.podIP, Container: c}, nil)
			if res != tc.want || msg != tc.wantMsg || errString(err) != tc.wantErr {
				t.Errorf("got %v %q %v, want %v %q %q", res, msg, err, tc.want, tc.wantMsg, tc.wantErr)
			}
		})
	}
}

func TestDoWithoutHandler(t *testing.T) {
	if res, _, err := Do(context.Background(), &v1.ProbeHandler{}, time.Second, Target{Container: &v1.Container{Name: "app"}}, nil); res != Unknown || err == nil {
		t.Errorf("empty handler: %v %v, want Unknown and an error", res, err)
	}
}

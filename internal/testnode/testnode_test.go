package testnode

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

func TestFlagsArgs(t *testing.T) {
	args := Flags{Namespace: "ns1", StatusSocket: "/s.sock"}.Args()
	for i := 0; i+1 < len(args); i += 2 {
		if (args[i] == "--containerd-namespace" && args[i+1] != "ns1") || (args[i] == "--status-socket" && args[i+1] != "/s.sock") {
			t.Errorf("%s %s", args[i], args[i+1])
		}
	}
	if !slices.Contains(args, "--api-port") || !slices.Contains(args, CNIBinDir) {
		t.Errorf("args %q: no --api-port or CNI bin dir", args)
	}
}

// serveStatus answers /healthz and /pods on a unix socket, as noderun does.
func serveStatus(t *testing.T, pods []v1.Pod) string {
	socket := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/pods", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(v1.PodList{Items: pods})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return socket
}

func TestStatusClient(t *testing.T) {
	running := v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}}}
	waiting := v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{}}}}
	c := NewStatusClient(serveStatus(t, []v1.Pod{running, waiting}), 10*time.Second, false)
	ctx := context.Background()
	pods, _, err := c.Pods(ctx)
	if err != nil || len(pods) != 2 {
		t.Fatalf("Pods = %d pods, %v; want 2", len(pods), err)
	}
	if !PodRunning(&pods[0]) || PodRunning(&pods[1]) {
		t.Errorf("PodRunning: %v %v, want true false", PodRunning(&pods[0]), PodRunning(&pods[1]))
	}
	if _, _, err := c.Fetch(ctx, "/nothing"); err == nil {
		t.Error("Fetch of a 404 succeeded")
	}
}

func TestProcess(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	p, err := Start(exec.Command("sleep", "60"), out, true)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Running() || !Alive(p.Process.Pid) {
		t.Fatal("not running after Start")
	}
	c := NewStatusClient(serveStatus(t, nil), 10*time.Second, false)
	if err := WaitHealthy(context.Background(), p, c, time.Minute, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !p.Stop(time.Minute) { // sleep dies of SIGTERM
		t.Error("SIGTERM did not end sleep")
	}
	if p.Running() || p.ProcessState == nil {
		t.Error("running after Stop")
	}
	if err := WaitHealthy(context.Background(), p, c, time.Minute, 10*time.Millisecond); err == nil {
		t.Error("WaitHealthy of an exited process succeeded")
	}
}

func TestProcReaders(t *testing.T) {
	pid := os.Getpid()
	v, err := StatusValues(pid, "VmRSS", "Threads")
	if err != nil || v["VmRSS"] <= 0 || v["Threads"] < 1 {
		t.Errorf("StatusValues = %v, %v", v, err)
	}
	if _, err := StatusValues(pid, "NoSuchKey"); err == nil {
		t.Error("StatusValues of a missing key succeeded")
	}
	if fds, _, err := FDs(pid); err != nil || fds < 3 {
		t.Errorf("FDs = %d, %v", fds, err)
	}
	if _, err := CPUTime(pid); err != nil {
		t.Error(err)
	}
	procs, err := Processes()
	if err != nil || !slices.ContainsFunc(procs, func(p Proc) bool { return p.PID == pid && slices.Equal(p.Args, os.Args) }) {
		t.Errorf("Processes does not list this one with its command line %q: %v", os.Args, err)
	}
	if ms, err := MountsUnder("/"); err != nil || !slices.ContainsFunc(ms, func(m Mount) bool { return m.Point == "/" }) {
		t.Errorf("MountsUnder(/) = %v, %v", ms, err)
	}
}

package testenv

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
)

// PlantShim starts a runc v2 shim for task id of namespace ns on the
// containerd at address, in bundle, the way containerd starts one, and
// returns its pid and socket once it serves. It serves no task. The test
// kills it and removes its socket at cleanup.
//
// Only a serving shim may lose its bundle: until then it still reads its
// working directory (os.Getwd before it serves), and a shim whose bundle
// went too early exits on its own.
func PlantShim(t testing.TB, bundle, address, ns, id string) (pid int, socket string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The shim logs to a FIFO its containerd reads.
	if err := unix.Mkfifo(filepath.Join(bundle, "log"), 0o600); err != nil {
		t.Fatal(err)
	}
	logReader, err := os.OpenFile(filepath.Join(bundle, "log"), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logReader.Close() })
	cmd := exec.Command("containerd-shim-runc-v2", "-namespace", ns, "-id", id, "-address", address, "start")
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "TTRPC_ADDRESS="+address+".ttrpc")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("start shim: %v: %s", err, out)
	}
	socket = strings.TrimPrefix(strings.TrimSpace(string(out)), "unix://")
	t.Cleanup(func() { os.Remove(socket) })
	var lastErr error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if pid, lastErr = shimPID(socket, id); lastErr == nil {
			// Pinned (a pidfd): once the shim is gone, the kill must not
			// reach a later process given its pid.
			if p, err := os.FindProcess(pid); err == nil {
				t.Cleanup(func() { _ = p.Kill() })
			}
			return pid, socket
		}
	}
	t.Fatalf("shim %s does not answer on %s: %v", id, socket, lastErr)
	return 0, ""
}

// shimPID asks the shim listening on socket for its pid; an answer means
// it serves.
func shimPID(socket, id string) (int, error) {
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return 0, err
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := taskapi.NewTaskClient(client).Connect(ctx, &taskapi.ConnectRequest{ID: id})
	if err != nil {
		return 0, err
	}
	return int(resp.ShimPid), nil
}

package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	taskv3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
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
	bootstrap := shimBootstraps(t)
	if bootstrap {
		cmd.Stdin = bytes.NewReader(bootstrapParams(id, ns, address))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start shim: %v: %s%s", err, out, stderr.Bytes())
	}
	if bootstrap {
		out = bootstrapAddress(t, out)
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
	// containerd 2.x's shims serve the task API's v3 only, 1.6's v2 only.
	if resp, err := taskv3.NewTTRPCTaskClient(client).Connect(ctx, &taskv3.ConnectRequest{ID: id}); !errdefs.IsNotImplemented(errdefs.FromGRPC(err)) {
		return int(resp.GetShimPid()), err
	}
	resp, err := taskapi.NewTaskClient(client).Connect(ctx, &taskapi.ConnectRequest{ID: id})
	if err != nil {
		return 0, err
	}
	return int(resp.ShimPid), nil
}

// shimBootstraps tells whether the containerd-shim-runc-v2 on PATH speaks
// containerd 2.3's bootstrap protocol: it refuses a start without
// BootstrapParams on stdin and answers with a BootstrapResult, where older
// shims read runtime options there and print their address.
func shimBootstraps(t testing.TB) bool {
	out, err := exec.Command("containerd-shim-runc-v2", "-v").Output()
	if err != nil {
		t.Fatalf("containerd-shim-runc-v2 -v: %v", err)
	}
	_, v, ok := strings.Cut(string(out), "Version:")
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d.%d", &major, &minor); !ok || err != nil {
		t.Fatalf("containerd-shim-runc-v2 -v: no version in %q", out)
	}
	return major > 2 || major == 2 && minor >= 3
}

// bootstrapParams encodes containerd.runtime.bootstrap.v1.BootstrapParams
// by hand (instance_id 1, namespace 2, containerd_ttrpc_address 5,
// containerd_grpc_address 6): the containerd API module noderun requires
// predates it.
func bootstrapParams(id, ns, address string) []byte {
	var b []byte
	for _, f := range []struct {
		num protowire.Number
		val string
	}{{1, id}, {2, ns}, {5, address + ".ttrpc"}, {6, address}} {
		b = protowire.AppendTag(b, f.num, protowire.BytesType)
		b = protowire.AppendString(b, f.val)
	}
	return b
}

// bootstrapAddress is the address (field 2) of an encoded BootstrapResult.
func bootstrapAddress(t testing.TB, b []byte) []byte {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == 2 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 {
				return v
			}
			break
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			break
		}
		b = b[n:]
	}
	t.Fatalf("shim start: no address in its bootstrap result %q", b)
	return nil
}

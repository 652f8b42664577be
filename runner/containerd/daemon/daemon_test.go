package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
)

const testNamespace = "noderun-test"

// startTestDaemon starts a private containerd that is stopped at cleanup.
func startTestDaemon(t *testing.T) *Process {
	t.Helper()
	testenv.RequireContainerd(t)
	root := t.TempDir()
	d, err := Start(context.Background(), filepath.Join(root, "root"), filepath.Join(root, "state"),
		filepath.Join(testenv.ShortTempDir(t), "c.sock"), filepath.Join(root, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return d
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStartDaemonStop(t *testing.T) {
	d := startTestDaemon(t)
	c, err := ctrd.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Version(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sid, _ := unix.Getsid(d.PID()); sid != d.PID() {
		t.Errorf("containerd session = %d, want its own (%d)", sid, d.PID())
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if alive(d.PID()) {
		t.Fatal("containerd still running after Stop")
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// mustSocketPID is the pid of the process listening on a unix socket.
func mustSocketPID(t *testing.T, path string) int {
	t.Helper()
	pid, err := socketPID(path)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestConnectStartsThenReuses(t *testing.T) {
	testenv.RequireContainerd(t)
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	cfg := Config{
		Address:   "/nonexistent/containerd.sock",
		StateDir:  t.TempDir(),
		RunDir:    testenv.ShortTempDir(t),
		Namespace: testNamespace,
		Logger:    testLogger(t),
		Root:      t.TempDir(), // no containerd installed
	}
	ctx := context.Background()
	c1, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Client.Close()
	if got, ok, err := readChoice(cfg.StateDir); !ok || err != nil || !got.Managed {
		t.Errorf("recorded choice %+v (%v, %v), want managed", got, ok, err)
	}
	socket := cfg.managedSocket()
	pid := mustSocketPID(t, socket)
	stopAtCleanup(t, pid)

	c2, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Client.Close()
	if again := mustSocketPID(t, socket); again != pid {
		t.Fatalf("second Connect talks to pid %d, want the running %d", again, pid)
	}
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "NOTIFY_SOCKET=") {
		t.Error("managed containerd inherited NOTIFY_SOCKET")
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "containerd", "containerd.log")); err != nil {
		t.Errorf("log file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "containerd", "io.containerd.metadata.v1.bolt")); err != nil {
		t.Errorf("root not under StateDir/containerd: %v", err)
	}
}

// stopPID stops now the containerd of pid that this test started through
// Connect.
func stopPID(t *testing.T, pid int) {
	t.Helper()
	p, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	stopProcess(p)
}

// stopAtCleanup stops the containerd of pid when the test ends. The
// process is pinned now (os.FindProcess holds a pidfd): should it be gone
// by then, the signals reach nothing, not a later process given its pid.
// The packages tested beside this one turn the pid space over within
// minutes, and a stray SIGTERM once stopped another suite's noderun.
func stopAtCleanup(t *testing.T, pid int) {
	t.Helper()
	p, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProcess(p) })
}

// stopProcess sends SIGTERM, then SIGKILL if p still runs after 10 s.
func stopProcess(p *os.Process) {
	_ = p.Signal(syscall.SIGTERM)
	if !exitsWithin(p, 10*time.Second) {
		_ = p.Kill()
	}
}

// exitsWithin reports whether p is gone within d.
func exitsWithin(p *os.Process, d time.Duration) bool {
	for deadline := time.Now().Add(d); p.Signal(syscall.Signal(0)) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func TestConnectWithoutContainerd(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Connect(context.Background(), Config{
		Address:  "/nonexistent/containerd.sock",
		StateDir: t.TempDir(),
		RunDir:   t.TempDir(),
	})
	if !errors.Is(err, ErrNoContainerd) {
		t.Fatalf("err = %v, want ErrNoContainerd", err)
	}
	for _, hint := range []string{"apt-get install containerd runc", "--containerd-address"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error %q does not mention %q", err, hint)
		}
	}
}

func TestStartDaemonEarlyExit(t *testing.T) {
	testenv.RequireContainerd(t)
	dir := t.TempDir()
	// A socket path longer than sun_path makes containerd exit at once.
	socket := filepath.Join(testenv.ShortTempDir(t), strings.Repeat("s", 120))
	logPath := filepath.Join(dir, "containerd.log")
	_, err := Start(context.Background(), filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, logPath)
	if err == nil {
		t.Fatal("Start succeeded with an unusable socket path")
	}
	if !strings.Contains(err.Error(), logPath) {
		t.Errorf("error %q does not point at the log", err)
	}
}

// A recorded system containerd that is briefly gone (restarting) is waited
// for: noderun does not start a managed one in its place, even where it
// would on a first start (no socket, no socket directory, no unit file).
func TestConnectWaitsForRecordedDaemon(t *testing.T) {
	testenv.RequireContainerd(t)
	root := t.TempDir()
	socketDir := filepath.Join(testenv.ShortTempDir(t), "d")
	socket := filepath.Join(socketDir, "c.sock")
	start := func() *Process {
		d, err := Start(context.Background(), filepath.Join(root, "root"), filepath.Join(root, "state"),
			socket, filepath.Join(root, "containerd.log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Stop(context.Background()) })
		return d
	}
	cfg := Config{
		Address: socket, StateDir: t.TempDir(), RunDir: testenv.ShortTempDir(t), Namespace: testNamespace,
		Logger: testLogger(t), Root: t.TempDir(),
	}
	first := start()
	conn, err := Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn.Client.Close()
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(socketDir); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		conn *Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Connect(ctx, cfg)
		done <- result{c, err}
	}()
	time.Sleep(2 * time.Second)
	if _, err := os.Stat(cfg.managedSocket()); !errors.Is(err, os.ErrNotExist) {
		if pid, err := socketPID(cfg.managedSocket()); err == nil {
			stopPID(t, pid)
		}
		t.Fatal("a managed containerd was started while the recorded one was away")
	}
	select {
	case r := <-done:
		t.Fatalf("Connect returned while nothing answered: %v", r.err)
	default:
	}
	second := start()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.conn.Client.Close()
	if pid := mustSocketPID(t, r.conn.Address); pid != second.PID() || r.conn.Managed {
		t.Fatalf("connected to pid %d (managed %v), want the recorded daemon, pid %d", pid, r.conn.Managed, second.PID())
	}
}

// connectManaged connects to a managed containerd of private directories,
// stopped with the test.
func connectManaged(t *testing.T) (Config, *Conn) {
	t.Helper()
	testenv.RequireContainerd(t)
	cfg := Config{
		Managed: true, StateDir: t.TempDir(), RunDir: testenv.ShortTempDir(t), Namespace: testNamespace, Logger: testLogger(t),
	}
	conn, err := Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Client.Close()
		if pid, err := socketPID(conn.Address); err == nil {
			stopPID(t, pid)
		}
	})
	return cfg, conn
}

// superviseUntilEnd runs conn.Supervise until the test ends, stopping it
// before the daemon is.
func superviseUntilEnd(t *testing.T, conn *Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	supervised := make(chan struct{})
	go func() {
		conn.Supervise(ctx)
		close(supervised)
	}()
	t.Cleanup(func() {
		cancel()
		<-supervised
	})
}

// waitRestarted waits until another process than pid serves conn's socket.
func waitRestarted(t *testing.T, conn *Conn, pid int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if again, err := socketPID(conn.Address); err == nil && again != pid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("managed containerd (pid %d) not restarted after 30s", pid)
		}
	}
}

// A managed containerd that dies is started again, and the client noderun
// holds talks to the new one.
func TestSuperviseRestartsManagedDaemon(t *testing.T) {
	_, conn := connectManaged(t)
	pid := mustSocketPID(t, conn.Address)
	superviseUntilEnd(t, conn)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitRestarted(t, conn, pid)
	vctx, vcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer vcancel()
	if _, err := conn.Client.Version(vctx); err != nil {
		t.Fatalf("client after the restart: %v", err)
	}
}

// A managed containerd whose pid has gone to another process by the time
// Supervise looks is restarted all the same, and the other process is
// left alone.
func TestSuperviseRestartsDaemonWhosePIDWasReused(t *testing.T) {
	testenv.ReusePID(t, func() bool {
		_, conn := connectManaged(t)
		pid := mustSocketPID(t, conn.Address)
		other, ok := testenv.KillAndTakePID(t, pid)
		if !ok {
			return false
		}
		superviseUntilEnd(t, conn)
		waitRestarted(t, conn, pid)
		if !testenv.EndedByKill(t, other) {
			t.Fatal("Supervise signalled the process given the pid of the daemon after it died")
		}
		return true
	})
}

// Issue 35's hang: Debian's containerd package on a host whose PID 1 is not
// systemd installs containerd.service, which nothing starts, and any
// containerd's shims have made the socket's directory (/run/containerd/s).
// A first start used to wait for that system containerd for ever; it runs
// a managed one and says why.
func TestConnectFirstStartWithoutServiceManager(t *testing.T) {
	testenv.RequireContainerd(t)
	host := t.TempDir()
	unit := filepath.Join(host, "lib/systemd/system/containerd.service")
	if err := os.MkdirAll(filepath.Dir(unit), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(unit, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	socketDir := filepath.Join(testenv.ShortTempDir(t), "containerd")
	if err := os.MkdirAll(filepath.Join(socketDir, "s"), 0o700); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var mu sync.Mutex
	cfg := Config{
		Address: filepath.Join(socketDir, "containerd.sock"), StateDir: t.TempDir(), RunDir: testenv.ShortTempDir(t),
		Namespace: testNamespace, Root: host, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &out}, nil)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := Connect(ctx, cfg)
	mu.Lock()
	log := out.String()
	mu.Unlock()
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	t.Cleanup(func() {
		conn.Client.Close()
		if pid, err := socketPID(conn.Address); err == nil {
			stopPID(t, pid)
		}
	})
	if !conn.Managed {
		t.Fatalf("chose %+v, want a managed containerd\n%s", conn.Choice, log)
	}
	if recorded, ok, err := readChoice(cfg.StateDir); err != nil || !ok || !recorded.Managed {
		t.Errorf("recorded %+v (%v, %v), want managed", recorded, ok, err)
	}
	for _, want := range []string{"chose the containerd to use", "/lib/systemd/system/containerd.service is installed, but systemd is not running"} {
		if !strings.Contains(log, want) {
			t.Errorf("log does not say %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "waiting for the system containerd") {
		t.Errorf("waited for the system containerd:\n%s", log)
	}
}

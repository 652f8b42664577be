package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBinDir is a PATH with a "containerd" that choose finds (and that is
// never run).
func fakeBinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "containerd"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestChoose: a system containerd is waited for only when something shows
// one will come: its socket or directory, or a running service manager
// with a containerd service. Files under a fake root stand for the host's.
func TestChoose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		managed bool     // --containerd-managed
		socket  bool     // a socket file at the configured address
		listen  bool     // something accepts connections on it
		dir     bool     // the socket's directory exists
		host    []string // files under the host root
		comm    string   // PID 1's name
		noBin   bool     // no containerd on PATH
		want    bool     // managed
		wantErr error
	}{
		{name: "nothing installed", want: true},
		{name: "asked for", managed: true, dir: true, host: []string{"run/systemd/system/", "lib/systemd/system/containerd.service"}, want: true},
		{name: "socket listening but not answering", socket: true, listen: true, dir: true},
		// A containerd killed, or one that ran once by hand: nothing
		// will start it again.
		{name: "stale socket", socket: true, dir: true, want: true},
		// /run/containerd/s: every containerd's shims make it.
		{name: "socket directory there", dir: true, want: true},
		// The hang of issue 35: Debian's package on a host whose PID 1
		// is not systemd, where a containerd's shims made the socket's
		// directory.
		{name: "unit installed, systemd not running, socket directory there", dir: true,
			host: []string{"lib/systemd/system/containerd.service"}, comm: "process_api", want: true},
		{name: "systemd running, unit installed, stale socket", socket: true, dir: true,
			host: []string{"run/systemd/system/", "lib/systemd/system/containerd.service"}},
		{name: "systemd running, unit installed", host: []string{"run/systemd/system/", "lib/systemd/system/containerd.service"}},
		{name: "systemd running, unit in /etc", host: []string{"run/systemd/system/", "etc/systemd/system/containerd.service"}},
		{name: "systemd running, no unit", host: []string{"run/systemd/system/", "etc/init.d/containerd"}, want: true},
		// Debian's package on a host whose PID 1 is not systemd.
		{name: "unit installed, systemd not running", host: []string{"lib/systemd/system/containerd.service"}, comm: "tini", want: true},
		{name: "OpenRC running, init script", host: []string{"run/openrc/", "etc/init.d/containerd"}},
		{name: "init script, OpenRC not running", host: []string{"etc/init.d/containerd"}, want: true},
		{name: "runit supervising", host: []string{"etc/service/containerd/supervise/"}},
		{name: "runit service never supervised", host: []string{"etc/service/containerd/run"}, want: true},
		{name: "s6 live service", host: []string{"run/service/containerd/"}},
		{name: "sysvinit with a runlevel link", host: []string{"etc/init.d/containerd", "etc/rc2.d/S01containerd"}, comm: "init"},
		{name: "runlevel link, PID 1 not sysvinit", host: []string{"etc/init.d/containerd", "etc/rc2.d/S01containerd"}, comm: "process_api", want: true},
		{name: "no binary", noBin: true, wantErr: ErrNoContainerd},
		{name: "no binary but a socket", noBin: true, socket: true, dir: true},
		{name: "no binary, socket directory there", noBin: true, dir: true, wantErr: ErrNoContainerd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			address := filepath.Join(root, "run", "containerd.sock")
			if tc.dir {
				if err := os.Mkdir(filepath.Dir(address), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.socket {
				staleSocket(t, address, tc.listen)
			}
			host := t.TempDir()
			files := tc.host
			if tc.comm != "" {
				files = append(files, "proc/1/comm")
			}
			for _, f := range files {
				path := filepath.Join(host, f)
				if strings.HasSuffix(f, "/") { // a directory
					if err := os.MkdirAll(path, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tc.comm+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			path := fakeBinDir(t)
			if tc.noBin {
				path = t.TempDir()
			}
			t.Setenv("PATH", path)
			cfg := Config{Address: address, Managed: tc.managed, StateDir: root, RunDir: filepath.Join(root, "r"), Root: host}
			got, why, err := cfg.choose(context.Background())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && got.Managed != tc.want {
				t.Fatalf("choice %+v (%s), want managed=%v", got, why, tc.want)
			}
			if err == nil && why == "" {
				t.Fatalf("chose %+v without saying why", got)
			}
		})
	}
}

// staleSocket makes a unix socket file at path, listening when listen is
// set, else left behind as by a containerd that was killed.
func staleSocket(t *testing.T, path string, listen bool) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if listen {
		t.Cleanup(func() { l.Close() })
		return
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

// Waiting for a system containerd that does not come says, once, what it
// waits for, why, and how to run a managed one instead.
func TestConnectSaysWhatItWaitsFor(t *testing.T) {
	t.Setenv("PATH", fakeBinDir(t))
	host := t.TempDir()
	for _, f := range []string{"run/systemd/system", "lib/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(host, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "lib/systemd/system/containerd.service"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var mu sync.Mutex
	cfg := Config{Address: filepath.Join(t.TempDir(), "none", "containerd.sock"), StateDir: t.TempDir(), RunDir: t.TempDir(),
		Root: host, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &out}, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if _, err := Connect(ctx, cfg); err == nil {
		t.Fatal("connected to nothing")
	}
	mu.Lock()
	log := out.String()
	mu.Unlock()
	if n := strings.Count(log, "waiting for the system containerd at "+cfg.Address); n != 1 {
		t.Errorf("said %d times what it waits for; want once:\n%s", n, log)
	}
	for _, want := range []string{"systemd will start it", "--containerd-managed"} {
		if !strings.Contains(log, want) {
			t.Errorf("log does not say %q:\n%s", want, log)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The flags may not move noderun to another daemon than the recorded one.
func TestConnectRefusesAnotherDaemon(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recorded Choice
		cfg      Config
	}{
		{"other address", Choice{Address: "/run/a.sock"}, Config{Address: "/run/b.sock"}},
		{"managed asked for", Choice{Address: "/run/a.sock"}, Config{Address: "/run/a.sock", Managed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.StateDir, tc.cfg.RunDir = t.TempDir(), t.TempDir()
			if err := writeChoice(tc.cfg.StateDir, tc.recorded); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := Connect(ctx, tc.cfg); !errors.Is(err, ErrChanged) {
				t.Fatalf("err = %v, want ErrChanged", err)
			}
		})
	}
}

// Commands beside noderun (images import) never start a containerd, even
// where noderun itself would start a managed one.
func TestDialNeverStarts(t *testing.T) {
	t.Setenv("PATH", fakeBinDir(t))
	cfg := Config{Address: "/nonexistent/containerd.sock", StateDir: t.TempDir(), RunDir: t.TempDir(),
		Root: t.TempDir()}
	if _, err := Dial(context.Background(), cfg); err == nil {
		t.Fatal("Dial succeeded with no containerd")
	}
	if _, err := os.Stat(filepath.Dir(cfg.managedSocket())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Dial prepared a managed containerd (%v)", err)
	}
}

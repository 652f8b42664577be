package containerd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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

func TestChoose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		managed bool // --containerd-managed
		socket  bool // a file at the configured address
		dir     bool // the socket's directory exists
		unit    bool // containerd.service installed
		noBin   bool // no containerd on PATH
		want    bool // managed
		wantErr error
	}{
		{name: "nothing installed", want: true},
		{name: "asked for", managed: true, dir: true, unit: true, want: true},
		{name: "socket there but not answering", socket: true, dir: true},
		{name: "socket directory there", dir: true},
		{name: "system service installed", unit: true},
		{name: "no binary", noBin: true, wantErr: ErrNoContainerd},
		{name: "no binary but a socket", noBin: true, socket: true, dir: true},
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
				if err := os.WriteFile(address, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			unitDir := t.TempDir()
			if tc.unit {
				if err := os.WriteFile(filepath.Join(unitDir, "containerd.service"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			path := fakeBinDir(t)
			if tc.noBin {
				path = t.TempDir()
			}
			t.Setenv("PATH", path)
			cfg := DaemonConfig{Address: address, Managed: tc.managed, StateDir: root, RunDir: filepath.Join(root, "r"),
				UnitDirs: []string{unitDir}}
			got, err := cfg.choose(context.Background())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && got.Managed != tc.want {
				t.Fatalf("choice %+v, want managed=%v", got, tc.want)
			}
		})
	}
}

// The flags may not move noderun to another daemon than the recorded one.
func TestConnectRefusesAnotherDaemon(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recorded Choice
		cfg      DaemonConfig
	}{
		{"other address", Choice{Address: "/run/a.sock"}, DaemonConfig{Address: "/run/b.sock"}},
		{"managed asked for", Choice{Address: "/run/a.sock"}, DaemonConfig{Address: "/run/a.sock", Managed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.StateDir, tc.cfg.RunDir = t.TempDir(), t.TempDir()
			if err := writeChoice(tc.cfg.StateDir, tc.recorded); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := Connect(ctx, tc.cfg); !errors.Is(err, ErrDaemonChanged) {
				t.Fatalf("err = %v, want ErrDaemonChanged", err)
			}
		})
	}
}

// Commands beside noderun (images import) never start a containerd, even
// where noderun itself would start a managed one.
func TestDialNeverStarts(t *testing.T) {
	t.Setenv("PATH", fakeBinDir(t))
	cfg := DaemonConfig{Address: "/nonexistent/containerd.sock", StateDir: t.TempDir(), RunDir: t.TempDir(),
		UnitDirs: []string{t.TempDir()}}
	if _, err := Dial(context.Background(), cfg); err == nil {
		t.Fatal("Dial succeeded with no containerd")
	}
	if _, err := os.Stat(filepath.Dir(cfg.managedSocket())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Dial prepared a managed containerd (%v)", err)
	}
}

package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/atomicfile"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// stubBinDir holds empty executables named like plugins: enough for New,
// which only checks that each plugin exists.
func stubBinDir(t *testing.T, plugins ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range plugins {
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewWritesDefaultConfig(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	cfg := Config{
		ConfDir:       filepath.Join(dir, "net.d"),
		BinDirs:       []string{stubBinDir(t, "bridge", "host-local", "portmap", "bandwidth", "loopback")},
		CacheDir:      filepath.Join(dir, "state", "cni", "cache"),
		DefaultSubnet: "10.200.9.0/24",
		DefaultBridge: "nrttest",
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if m.NetworkName() != "nrttest" {
		t.Errorf("NetworkName() = %q, want the bridge's name nrttest", m.NetworkName())
	}
	path := filepath.Join(cfg.ConfDir, "10-noderun.conflist")
	if !strings.Contains(logs.String(), path) {
		t.Errorf("log does not say where the default config went:\n%s", logs.String())
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plugins []struct {
			Type         string
			Bridge       string
			IsGateway    bool
			IPMasq       bool
			Capabilities map[string]bool
			IPAM         struct {
				Type    string
				DataDir string
				Ranges  [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Plugins) != 4 {
		t.Fatalf("want bridge, portmap, bandwidth, loopback; got %s", data)
	}
	br, pm, bw := got.Plugins[0], got.Plugins[1], got.Plugins[2]
	if br.Type != "bridge" || br.Bridge != "nrttest" || !br.IsGateway || !br.IPMasq {
		t.Errorf("bridge plugin: %+v", br)
	}
	if br.IPAM.Type != "host-local" || br.IPAM.Ranges[0][0].Subnet != "10.200.9.0/24" ||
		br.IPAM.DataDir != filepath.Join(dir, "state", "cni", "networks") {
		t.Errorf("ipam: %+v", br.IPAM)
	}
	if pm.Type != "portmap" || !pm.Capabilities["portMappings"] {
		t.Errorf("portmap plugin: %+v", pm)
	}
	if bw.Type != "bandwidth" || !bw.Capabilities["bandwidth"] {
		t.Errorf("bandwidth plugin: %+v", bw)
	}
	if got.Plugins[3].Type != "loopback" {
		t.Errorf("last plugin: %+v", got.Plugins[3])
	}
	if err := m.Ready(); err != nil {
		t.Errorf("Ready() = %v", err)
	}

	// A restart loads the file it wrote instead of writing another.
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(cfg.ConfDir)
	if len(entries) != 1 {
		t.Errorf("conf dir holds %d entries, want 1", len(entries))
	}
}

func TestNewPicksFirstConfig(t *testing.T) {
	const list = `{"cniVersion":"1.0.0","name":"%s","plugins":[{"type":"bridge"}]}`
	const single = `{"cniVersion":"1.0.0","name":"%s","type":"bridge"}`
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{
			name: "conflist first",
			files: map[string]string{
				"20-b.conf":      strings.Replace(single, "%s", "b", 1),
				"10-a.conflist":  strings.Replace(list, "%s", "a", 1),
				"30-c.json":      strings.Replace(list, "%s", "c", 1),
				"00-ignored.txt": "not a config",
			},
			want: "a",
		},
		{
			name: "single plugin conf wrapped into a list",
			files: map[string]string{
				"05-single.conf":    strings.Replace(single, "%s", "single", 1),
				"99-last.conflist":  strings.Replace(list, "%s", "last", 1),
				".00-hidden.swp":    "x",
				"01-dir.conf/inner": "",
			},
			want: "single",
		},
		{
			name:  "json conflist",
			files: map[string]string{"50-x.json": strings.Replace(list, "%s", "x", 1)},
			want:  "x",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			confDir := t.TempDir()
			for name, data := range tt.files {
				if d := filepath.Dir(name); d != "." {
					writeFiles(t, filepath.Join(confDir, d), nil)
				}
				writeFiles(t, confDir, map[string]string{name: data})
			}
			m, err := New(Config{
				ConfDir:  confDir,
				BinDirs:  []string{stubBinDir(t, "bridge")},
				CacheDir: filepath.Join(t.TempDir(), "cache"),
				Logger:   testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			if m.NetworkName() != tt.want {
				t.Errorf("NetworkName() = %q, want %q", m.NetworkName(), tt.want)
			}
			if len(m.list.Plugins) != 1 || m.list.Plugins[0].Network.Type != "bridge" {
				t.Errorf("plugins = %+v, want one bridge", m.list.Plugins)
			}
		})
	}
}

func TestNotReady(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		wantIs   error
		wantText []string
	}{
		{
			name:     "missing plugin",
			files:    map[string]string{"10-net.conflist": `{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"},{"type":"nrt-no-such-plugin"}]}`},
			wantIs:   ErrPluginNotFound,
			wantText: []string{"10-net.conflist", `"nrt-no-such-plugin"`, "bin dirs"},
		},
		{
			name:     "malformed",
			files:    map[string]string{"10-bad.conf": `{"name":`},
			wantText: []string{"10-bad.conf"},
		},
		{
			name:     "single plugin without type",
			files:    map[string]string{"10-notype.conf": `{"cniVersion":"1.0.0","name":"net"}`},
			wantText: []string{"10-notype.conf", "type"},
		},
		{
			// The first file decides, even if a later one is fine.
			name: "first of two broken",
			files: map[string]string{
				"10-bad.conflist": `{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}`,
				"20-ok.conflist":  `{"cniVersion":"1.0.0","name":"ok","plugins":[{"type":"bridge"}]}`,
			},
			wantText: []string{"10-bad.conflist", "no name"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			confDir := t.TempDir()
			writeFiles(t, confDir, tt.files)
			m, err := New(Config{
				ConfDir:  confDir,
				BinDirs:  []string{stubBinDir(t, "bridge")},
				CacheDir: filepath.Join(t.TempDir(), "cache"),
				Logger:   testLogger(t),
			})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			err = m.Ready()
			if !errors.Is(err, ErrNetworkNotReady) {
				t.Fatalf("Ready() = %v, want ErrNetworkNotReady", err)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q is not %v", err, tt.wantIs)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %s", err, s)
				}
			}
			_, err = m.Add(context.Background(), Attachment{ID: "nrt-x", NetNS: "/proc/self/ns/net"})
			if !errors.Is(err, ErrNetworkNotReady) {
				t.Errorf("Add() = %v, want ErrNetworkNotReady", err)
			}
		})
	}
}

// TestReload changes the config dir under a Manager and checks that each
// change shows in the next Ready, without a new Manager.
func TestReload(t *testing.T) {
	confDir := t.TempDir()
	binDir := stubBinDir(t, "bridge")
	writeFiles(t, confDir, map[string]string{"10-net.conflist": `{"name":`})
	m, err := New(Config{
		ConfDir:  confDir,
		BinDirs:  []string{binDir},
		CacheDir: filepath.Join(t.TempDir(), "cache"),
		Logger:   testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	const list = `{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":%q}]}`
	steps := []struct {
		name      string
		change    func()
		wantReady bool
		wantNet   string
	}{
		{"broken at start", func() {}, false, ""},
		{"fixed", func() {
			writeFiles(t, confDir, map[string]string{"10-net.conflist": fmt.Sprintf(list, "fixed", "bridge")})
		}, true, "fixed"},
		{"replaced by rename", func() {
			if err := atomicfile.WriteFile(filepath.Join(confDir, "10-net.conflist"), fmt.Appendf(nil, list, "renamed", "bridge"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, true, "renamed"},
		{"an earlier file appears", func() {
			writeFiles(t, confDir, map[string]string{"05-first.conflist": fmt.Sprintf(list, "first", "bridge")})
		}, true, "first"},
		{"its plugin goes missing", func() {
			writeFiles(t, confDir, map[string]string{"05-first.conflist": fmt.Sprintf(list, "first", "nrt-later")})
		}, false, "first"},
		{"the plugin is installed", func() {
			writeFiles(t, binDir, map[string]string{"nrt-later": ""})
			if err := os.Chmod(filepath.Join(binDir, "nrt-later"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, true, "first"},
		{"broken again", func() {
			writeFiles(t, confDir, map[string]string{"05-first.conflist": `[]`})
		}, false, "first"}, // the last good config stays for DELs without a cache
		{"all configs removed", func() {
			for _, f := range []string{"05-first.conflist", "10-net.conflist"} {
				if err := os.Remove(filepath.Join(confDir, f)); err != nil {
					t.Fatal(err)
				}
			}
		}, false, "first"},
	}
	for _, st := range steps {
		st.change()
		err := m.Ready()
		if (err == nil) != st.wantReady {
			t.Errorf("%s: Ready() = %v, want ready %v", st.name, err, st.wantReady)
		}
		if err != nil && !errors.Is(err, ErrNetworkNotReady) {
			t.Errorf("%s: %v is not ErrNetworkNotReady", st.name, err)
		}
		if got := m.NetworkName(); got != st.wantNet {
			t.Errorf("%s: NetworkName() = %q, want %q", st.name, got, st.wantNet)
		}
	}
}

package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		BinDirs:       []string{stubBinDir(t, "bridge", "host-local", "portmap", "loopback")},
		CacheDir:      filepath.Join(dir, "state", "cni", "cache"),
		DefaultSubnet: "10.200.9.0/24",
		DefaultBridge: "nrttest",
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if m.NetworkName() != "noderun" {
		t.Errorf("NetworkName() = %q, want noderun", m.NetworkName())
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
	if len(got.Plugins) != 3 {
		t.Fatalf("want bridge, portmap, loopback; got %s", data)
	}
	br, pm := got.Plugins[0], got.Plugins[1]
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
	if got.Plugins[2].Type != "loopback" {
		t.Errorf("last plugin: %+v", got.Plugins[2])
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

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name     string
		file     string
		data     string
		wantIs   error
		wantText []string
	}{
		{
			name:     "missing plugin",
			file:     "10-net.conflist",
			data:     `{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"},{"type":"nrt-no-such-plugin"}]}`,
			wantIs:   ErrPluginNotFound,
			wantText: []string{"10-net.conflist", `"nrt-no-such-plugin"`},
		},
		{
			name:     "malformed",
			file:     "10-bad.conf",
			data:     `{"name":`,
			wantText: []string{"10-bad.conf"},
		},
		{
			name:     "single plugin without type",
			file:     "10-notype.conf",
			data:     `{"cniVersion":"1.0.0","name":"net"}`,
			wantText: []string{"10-notype.conf", "type"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			confDir := t.TempDir()
			writeFiles(t, confDir, map[string]string{tt.file: tt.data})
			_, err := New(Config{
				ConfDir:  confDir,
				BinDirs:  []string{stubBinDir(t, "bridge")},
				CacheDir: filepath.Join(t.TempDir(), "cache"),
			})
			if err == nil {
				t.Fatal("New succeeded")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %q is not %v", err, tt.wantIs)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %s", err, s)
				}
			}
		})
	}
}

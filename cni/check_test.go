package cni

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckUnrelatedPluginError chains a plugin whose CHECK fails for a
// reason of its own after the real ones: the pod's network is intact, so
// Check must not call it broken. Removing the pod's address then is.
func TestCheckUnrelatedPluginError(t *testing.T) {
	requirePlugins(t)
	cfg := testNetwork(t)
	bin := t.TempDir()
	// ADD and DEL pass the previous result through, as tuning does with
	// no settings; CHECK fails as, say, a firewall plugin without its
	// backend would.
	writeFiles(t, bin, map[string]string{"nrt-badcheck": `#!/bin/sh
if [ "$CNI_COMMAND" = CHECK ]; then
	echo '{"cniVersion":"1.0.0","code":999,"msg":"firewall backend unavailable"}'
	exit 1
fi
exec ` + filepath.Join(pluginDir, "tuning") + "\n"})
	if err := os.Chmod(filepath.Join(bin, "nrt-badcheck"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.BinDirs = []string{bin, pluginDir}
	addPlugin(t, cfg, map[string]any{"type": "nrt-badcheck"})
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := testPod(t, m, "badcheck")
	ips, err := m.Add(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// As the caller does once the address is gone: the plugins
		// cannot find the rules through the pod's interface.
		if err := m.Del(ctx, withoutNetNS(a)); err != nil {
			t.Error(err)
		}
	})
	err = m.Check(ctx, a)
	if err == nil || errors.Is(err, ErrCheckFailed) {
		t.Fatalf("Check with an unrelated plugin error = %v, want an error that is not ErrCheckFailed", err)
	}
	t.Logf("Check of an intact pod with a failing plugin: %v", err)

	run(t, "nsenter", "--net="+a.NetNS, "ip", "addr", "del", ips[0]+"/24", "dev", ifName)
	if err := m.Check(ctx, a); !errors.Is(err, ErrCheckFailed) {
		t.Fatalf("Check after removing the pod's address = %v, want ErrCheckFailed", err)
	}
}

func withoutNetNS(a Attachment) Attachment {
	a.NetNS = ""
	return a
}

// addPlugin writes the default config with p appended to its chain.
func addPlugin(t *testing.T, cfg Config, p map[string]any) {
	t.Helper()
	path := writeDefault(t, cfg)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	conf["plugins"] = append(conf["plugins"].([]any), p)
	if data, err = json.Marshal(conf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

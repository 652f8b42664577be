package cni

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func addBridge(t *testing.T, name string) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
}

func bridgeExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

// The bridge plugin creates the bridge at the first ADD, after noderun
// wrote its config into a directory it made: all three are noderun's and
// go.
func TestRemoveDefaultNetworkRemovesWhatNoderunMade(t *testing.T) {
	requireRoot(t)
	cfg := testNetwork(t)
	path := writeDefault(t, cfg)
	addBridge(t, cfg.DefaultBridge)
	removed, kept, err := RemoveDefaultNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{path, cfg.ConfDir, "bridge " + cfg.DefaultBridge}) || len(kept) != 0 {
		t.Fatalf("removed %q, kept %q; want the config, its directory and the bridge removed", removed, kept)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("config still there: %v", err)
	}
	if bridgeExists(cfg.DefaultBridge) {
		t.Error("bridge still there")
	}
	// Idempotent: the record is gone, nothing more is touched.
	if removed, kept, err := RemoveDefaultNetwork(cfg); err != nil || removed != nil || kept != nil {
		t.Fatalf("second call: %q %q %v; want nothing", removed, kept, err)
	}
}

// An edited config and a bridge that was there before noderun are the
// admin's: kept, with the reason.
func TestRemoveDefaultNetworkKeepsWhatIsNotNoderuns(t *testing.T) {
	requireRoot(t)
	cfg := testNetwork(t)
	addBridge(t, cfg.DefaultBridge)
	path := writeDefault(t, cfg)
	if err := os.WriteFile(path, []byte(`{"name":"edited"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, kept, err := RemoveDefaultNetwork(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 0 || len(kept) != 2 || !strings.Contains(kept[0], "changed since") || !strings.Contains(kept[1], "existed before") {
		t.Fatalf("removed %q, kept %q; want both kept with reasons", removed, kept)
	}
	if _, err := os.Stat(path); err != nil || !bridgeExists(cfg.DefaultBridge) {
		t.Fatalf("config (%v) or bridge removed", err)
	}
}

// A config directory that was there before noderun wrote into it stays
// (seen in make test-vm: reset left /etc/cni/net.d, empty, behind, when
// noderun had made it).
func TestRemoveDefaultNetworkKeepsADirItDidNotMake(t *testing.T) {
	requireRoot(t)
	cfg := testNetwork(t)
	if err := os.MkdirAll(cfg.ConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := writeDefault(t, cfg)
	removed, kept, err := RemoveDefaultNetwork(cfg)
	if err != nil || !slices.Equal(removed, []string{path}) || len(kept) != 0 {
		t.Fatalf("removed %q, kept %q, %v; want only the config removed", removed, kept, err)
	}
	if _, err := os.Stat(cfg.ConfDir); err != nil {
		t.Errorf("the directory that existed before: %v", err)
	}
}

// Without a record noderun never wrote a default config here (the e2e
// harness writes its own): nothing is removed.
func TestRemoveDefaultNetworkWithoutRecord(t *testing.T) {
	cfg := Config{ConfDir: t.TempDir(), CacheDir: t.TempDir() + "/cni/cache", DefaultBridge: "nrtnone"}
	writeFiles(t, cfg.ConfDir, map[string]string{defaultConfName: "{}"})
	if removed, kept, err := RemoveDefaultNetwork(cfg); err != nil || removed != nil || kept != nil {
		t.Fatalf("got %q %q %v; want nothing", removed, kept, err)
	}
}

// writeDefault writes noderun's default config for cfg, as New does.
func writeDefault(t *testing.T, cfg Config) string {
	t.Helper()
	data, err := DefaultConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path, err := writeDefaultConfig(cfg, data)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

package cni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/noderun/noderun/internal/atomicfile"
)

// defaultRecord says what noderun created for its default network, so that
// RemoveDefaultNetwork removes only that: the config file as written (not
// one an admin edited since), its directory if noderun made it, and the
// bridge, unless it existed before.
type defaultRecord struct {
	Path          string `json:"path"`
	SHA256        string `json:"sha256"`
	Bridge        string `json:"bridge"`
	BridgeExisted bool   `json:"bridgeExisted"`
	DirCreated    bool   `json:"dirCreated,omitempty"`
}

// recordPath is beside the cache, in noderun's state dir.
func recordPath(cacheDir string) string {
	return filepath.Join(filepath.Dir(cacheDir), "default-network.json")
}

// recordDefault is written before the config itself: a crash between the
// two leaves a record whose file is missing, which removal skips, never a
// config of noderun's that nothing remembers.
func recordDefault(cfg Config, path string, data []byte, dirCreated bool) error {
	sum := sha256.Sum256(data)
	rec := defaultRecord{Path: path, SHA256: hex.EncodeToString(sum[:]), Bridge: cfg.DefaultBridge, DirCreated: dirCreated}
	if _, err := netlink.LinkByName(cfg.DefaultBridge); err == nil {
		rec.BridgeExisted = true
	}
	if prev, err := readRecord(cfg.CacheDir); err == nil && prev.Bridge == rec.Bridge && prev.Path == rec.Path {
		// Rewritten after an admin removed it: the bridge is still ours.
		rec.BridgeExisted = prev.BridgeExisted
		rec.DirCreated = rec.DirCreated || prev.DirCreated
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(recordPath(cfg.CacheDir)), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(recordPath(cfg.CacheDir), append(b, '\n'), 0o644)
}

func readRecord(cacheDir string) (defaultRecord, error) {
	var rec defaultRecord
	b, err := os.ReadFile(recordPath(cacheDir))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("cni: %s: %w", recordPath(cacheDir), err)
	}
	return rec, nil
}

// RemoveDefaultNetwork removes the default config and bridge noderun
// created, and the node-wide masquerade of its pods, as its record in the
// state dir (cfg.CacheDir's parent) says; call it once no pod is attached. A config changed since it was written,
// a bridge that existed before, or one that still has ports is kept, and
// kept says why. Without a record (noderun wrote no default config, or
// wrote it before it kept records) nothing is touched.
func RemoveDefaultNetwork(cfg Config) (removed, kept []string, err error) {
	rec, err := readRecord(cfg.CacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(rec.Path)
	sum := sha256.Sum256(data)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, nil, fmt.Errorf("cni: read %s: %w", rec.Path, err)
	case hex.EncodeToString(sum[:]) != rec.SHA256:
		kept = append(kept, rec.Path+": changed since noderun wrote it")
	default:
		if err := os.Remove(rec.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, kept, fmt.Errorf("cni: remove %s: %w", rec.Path, err)
		}
		removed = append(removed, rec.Path)
		if rec.DirCreated {
			dir := filepath.Dir(rec.Path)
			switch err := os.Remove(dir); {
			case err == nil:
				removed = append(removed, dir)
			case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
				kept = append(kept, dir+": holds other files")
			case !errors.Is(err, fs.ErrNotExist):
				return removed, kept, fmt.Errorf("cni: remove %s: %w", dir, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeouts.op)
	defer cancel()
	if err := RemoveMasquerade(ctx, defaultNetworkName(rec.Bridge)); err != nil {
		return removed, kept, err
	}
	gone, why, err := removeBridge(rec)
	if err != nil {
		return removed, kept, err
	}
	if gone {
		removed = append(removed, "bridge "+rec.Bridge)
	} else if why != "" {
		kept = append(kept, "bridge "+rec.Bridge+": "+why)
	}
	if err := os.Remove(recordPath(cfg.CacheDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return removed, kept, err
	}
	return removed, kept, nil
}

// removeBridge deletes the default network's bridge if noderun's bridge
// plugin created it and nothing is attached to it any more.
func removeBridge(rec defaultRecord) (gone bool, why string, err error) {
	if rec.BridgeExisted {
		return false, "it existed before noderun wrote its config", nil
	}
	l, err := netlink.LinkByName(rec.Bridge)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return false, "", nil // no pod ever attached, or removed already
	}
	if err != nil {
		return false, "", fmt.Errorf("cni: find bridge %s: %w", rec.Bridge, err)
	}
	if l.Type() != "bridge" {
		return false, "not a bridge", nil
	}
	links, err := netlink.LinkList()
	if err != nil {
		return false, "", fmt.Errorf("cni: list links: %w", err)
	}
	for _, o := range links {
		if o.Attrs().MasterIndex == l.Attrs().Index {
			return false, "still has port " + o.Attrs().Name, nil
		}
	}
	if err := netlink.LinkDel(l); err != nil {
		return false, "", fmt.Errorf("cni: remove bridge %s: %w", rec.Bridge, err)
	}
	return true, "", nil
}

package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
)

// ErrPluginNotFound means the network config names a plugin that is in none
// of the bin dirs.
var ErrPluginNotFound = errors.New("CNI plugin not found")

// Defaults for the network written when ConfDir holds no config.
const (
	DefaultSubnet   = "10.244.77.0/24"
	DefaultBridge   = "noderun0"
	defaultConfName = "10-noderun.conflist"
	defaultNetName  = "noderun"
	// cniVersion of the default config: the newest the plugins shipped by
	// distributions (e.g. Debian 12's 1.1.1) accept.
	defaultCNIVersion = "1.0.0"
)

// Config says where the CNI config, plugins and state live.
type Config struct {
	ConfDir  string   // --cni-conf-dir
	BinDirs  []string // --cni-bin-dir split on ':'
	CacheDir string   // libcni's result cache, under noderun's state dir
	// DefaultSubnet and DefaultBridge shape the config written when ConfDir
	// holds none; empty means DefaultSubnet / DefaultBridge.
	DefaultSubnet string
	DefaultBridge string
	Logger        *slog.Logger // nil discards
}

// Manager attaches pods to the one network loaded by New. Its methods are
// safe for concurrent use: each call runs the plugins anew.
type Manager struct {
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
	log  *slog.Logger
}

// New loads the lexicographically first *.conflist, *.conf or *.json in
// ConfDir, as the kubelet and containerd do. If there is none it first writes
// a default bridge network there. Every plugin the config names must be in a
// bin dir, so a broken setup fails at start rather than at the first pod.
func New(cfg Config) (*Manager, error) {
	if cfg.ConfDir == "" || cfg.CacheDir == "" || len(cfg.BinDirs) == 0 {
		return nil, errors.New("cni: ConfDir, CacheDir and BinDirs are required")
	}
	if cfg.DefaultSubnet == "" {
		cfg.DefaultSubnet = DefaultSubnet
	}
	if cfg.DefaultBridge == "" {
		cfg.DefaultBridge = DefaultBridge
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	path, err := findConfig(cfg.ConfDir)
	if err != nil {
		return nil, err
	}
	if path == "" {
		if path, err = writeDefaultConfig(cfg); err != nil {
			return nil, err
		}
		log.Info("wrote default CNI config", "path", path, "bridge", cfg.DefaultBridge, "subnet", cfg.DefaultSubnet)
	}
	list, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	for _, p := range list.Plugins {
		if _, err := invoke.FindInPath(p.Network.Type, cfg.BinDirs); err != nil {
			return nil, fmt.Errorf("cni: %s: plugin %q: %w in %v", path, p.Network.Type, ErrPluginNotFound, cfg.BinDirs)
		}
	}
	log.Info("loaded CNI config", "path", path, "network", list.Name)
	return &Manager{
		cni:  libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, cfg.CacheDir, nil),
		list: list,
		log:  log,
	}, nil
}

// NetworkName is the name of the loaded network.
func (m *Manager) NetworkName() string { return m.list.Name }

// findConfig returns the first config file in dir, or "" if there is none.
func findConfig(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return "", fmt.Errorf("cni: read config dir %s: %w", dir, err)
	}
	if len(files) == 0 {
		return "", nil
	}
	sort.Strings(files)
	return files[0], nil
}

// loadConfig reads a network config list, or a single plugin config (any
// extension) wrapped into a list of one.
func loadConfig(path string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	var probe struct {
		Plugins json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("cni: %s: %w", path, err)
	}
	var list *libcni.NetworkConfigList
	if probe.Plugins != nil {
		list, err = libcni.NetworkConfFromFile(path)
	} else {
		var conf *libcni.PluginConfig
		if conf, err = libcni.NetworkPluginConfFromBytes(data); err == nil {
			list, err = libcni.ConfListFromConf(conf)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cni: %s: %w", path, err)
	}
	if list.Name == "" {
		return nil, fmt.Errorf("cni: %s: network has no name", path)
	}
	return list, nil
}

// writeDefaultConfig writes a bridge network with host-local IPAM, masquerade
// and hostPort support. host-local keeps its leases next to CacheDir rather
// than in /var/lib/cni, so all noderun state sits in its own state dir.
func writeDefaultConfig(cfg Config) (string, error) {
	if _, _, err := net.ParseCIDR(cfg.DefaultSubnet); err != nil {
		return "", fmt.Errorf("cni: default subnet: %w", err)
	}
	type obj = map[string]any
	conf := obj{
		"cniVersion": defaultCNIVersion,
		"name":       defaultNetName,
		"plugins": []obj{
			{
				"type":        "bridge",
				"bridge":      cfg.DefaultBridge,
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  [][]obj{{{"subnet": cfg.DefaultSubnet}}},
					"routes":  []obj{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(filepath.Dir(cfg.CacheDir), "networks"),
				},
			},
			{"type": "portmap", "capabilities": obj{"portMappings": true}},
			{"type": "loopback"},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return "", fmt.Errorf("cni: default config: %w", err)
	}
	path := filepath.Join(cfg.ConfDir, defaultConfName)
	if err := writeFileAtomic(path, append(data, '\n')); err != nil {
		return "", fmt.Errorf("cni: write default config %s: %w", path, err)
	}
	return path, nil
}

// writeFileAtomic writes via a dot-file and rename, so a reader (or a
// restart after a crash) never sees half a config.
func writeFileAtomic(path string, data []byte) (retErr error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

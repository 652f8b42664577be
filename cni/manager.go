package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/noderun/noderun/internal/atomicfile"
)

var (
	// ErrNetworkNotReady means no usable network config is loaded: none in
	// ConfDir, an invalid one, or a plugin it names is missing. New pods
	// cannot be attached until it is fixed; the error says what to fix.
	ErrNetworkNotReady = errors.New("network not ready")
	// ErrPluginNotFound means the network config names a plugin that is in
	// none of the bin dirs. It comes wrapped in ErrNetworkNotReady.
	ErrPluginNotFound = errors.New("CNI plugin not found")
)

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
	// NoDefault never writes the default config (noderun reset).
	NoDefault bool
	// DefaultSubnet and DefaultBridge shape the config written when ConfDir
	// holds none; empty means DefaultSubnet / DefaultBridge.
	DefaultSubnet string
	DefaultBridge string
	Logger        *slog.Logger // nil discards
}

// Manager attaches pods to the network of the first config in ConfDir,
// reloaded when that file changes. Its methods are safe for concurrent use:
// each call runs the plugins anew.
type Manager struct {
	cni     *libcni.CNIConfig
	confDir string
	binDirs []string
	log     *slog.Logger
	owned   ledger // the IDs noderun may have made state for
	bounds  timeouts

	mu sync.Mutex
	// The config file as last seen, to notice a change with one stat.
	seen configFile
	// list is the last config that parsed, kept while the file is broken
	// as the best guess for a DEL that has no cached config.
	list *libcni.NetworkConfigList
	// own says list is byte for byte the default config noderun writes for
	// its settings (defaultConf), so Add may run only the plugins a pod
	// needs (chain.go). A user's config always runs whole.
	own         bool
	defaultConf []byte
	subnet      string         // of the default config
	loadErr     error          // why the file last seen did not load
	notReady    error          // as last reported, to log only changes
	busy        map[string]int // IDs with an Add, Del or Check running; GC skips them

	gcMu sync.Mutex // one GC at a time, so that two never DEL the same ID

	// The node-wide masquerade of the own config's subnet (masq.go), put
	// in place at the first Add of each config loaded: masqFor is the
	// config it was tried for, masqOK whether it is in place, so that the
	// pods' chains leave the bridge plugin's ipMasq out.
	masqMu  sync.Mutex
	masqFor *libcni.NetworkConfigList
	masqOK  bool
}

// timeouts bound the waits on plugins and locks, so that a hung plugin or a
// lock another process holds fails one call instead of stalling its caller
// (a pod's worker, or GC) for good.
type timeouts struct {
	// op bounds an ADD or DEL of the whole chain: its plugins wait on
	// host-local's and the xtables lock themselves, without a bound.
	op time.Duration
	// check bounds a CHECK, which only reads state.
	check time.Duration
	// lock bounds GC's wait for host-local's lock of one lease dir, which
	// an ADD or DEL holds only for a moment.
	lock time.Duration
}

// defaultTimeouts are generous: a healthy ADD of the default chain takes
// well under a second, and a busy host's xtables lock some seconds.
var defaultTimeouts = timeouts{op: time.Minute, check: 20 * time.Second, lock: 10 * time.Second}

// configFile identifies a version of a config file without reading it.
type configFile struct {
	path  string
	ino   uint64
	size  int64
	mtime int64 // ns; an int so that == compares it
}

// New returns a Manager for the lexicographically first *.conflist, *.conf
// or *.json in ConfDir, as the kubelet and containerd pick it, after writing
// a default bridge network there if ConfDir holds no config at all. An
// invalid config or a missing plugin is not an error here: the Manager
// reports it through Ready and Add until it is fixed. New fails only on an
// incomplete Config or when it cannot write the default config.
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
	m := &Manager{
		cni:     libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, cfg.CacheDir, newPluginExec(log)),
		confDir: cfg.ConfDir,
		binDirs: cfg.BinDirs,
		log:     log,
		// Beside the cache: as private to noderun, and as durable.
		owned:  ledger{filepath.Join(filepath.Dir(cfg.CacheDir), "owned")},
		busy:   map[string]int{},
		bounds: defaultTimeouts,
		subnet: cfg.DefaultSubnet,
	}
	var err error
	if m.defaultConf, err = DefaultConfig(cfg); err != nil {
		return nil, err
	}
	// An unreadable ConfDir is left for Ready to report.
	if path, err := findConfig(cfg.ConfDir); err == nil && path == "" && !cfg.NoDefault {
		if path, err = writeDefaultConfig(cfg, m.defaultConf); err != nil {
			return nil, err
		}
		log.Info("wrote default CNI config", "path", path, "bridge", cfg.DefaultBridge, "subnet", cfg.DefaultSubnet)
	}
	m.refresh() // logs what it found; Ready and Add report it
	return m, nil
}

// Ready returns nil when new pods can be attached, or an error wrapping
// ErrNetworkNotReady that names the config file and what is wrong with it.
// Like Add, it first reloads the config if the file changed.
func (m *Manager) Ready() error {
	_, _, err := m.refresh()
	return err
}

// NetworkName is the name of the network in the last config that loaded, or
// "" if none did.
func (m *Manager) NetworkName() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.list == nil {
		return ""
	}
	return m.list.Name
}

// refresh reloads the config when the first config file in ConfDir is
// another one, or was rewritten, since the last call, and checks that its
// plugins are (still) installed. Both are a few stats, cheap enough to do
// before every ADD. It returns the config for new attachments and whether
// it is noderun's own default, or why there is none.
func (m *Manager) refresh() (*libcni.NetworkConfigList, bool, error) {
	file, statErr := statConfig(m.confDir)

	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	switch {
	case statErr != nil:
		err = statErr
	case file.path == "":
		err = fmt.Errorf("no network config in %s", m.confDir)
	default:
		if file != m.seen {
			m.seen = file
			list, data, loadErr := loadConfig(file.path)
			m.loadErr = loadErr
			if loadErr == nil {
				m.list, m.own = list, bytes.Equal(data, m.defaultConf)
				m.log.Info("loaded CNI config", "path", file.path, "network", list.Name, "noderun-default", m.own)
			}
		}
		err = m.loadErr
		if err == nil {
			err = checkPlugins(file.path, m.list, m.binDirs)
		}
	}
	if err != nil {
		err = fmt.Errorf("cni: %w: %w", ErrNetworkNotReady, err)
	}
	m.logReadiness(err)
	if err != nil {
		return nil, false, err
	}
	return m.list, m.own, nil
}

// nodeMasquerade puts the node-wide masquerade of own, the default config
// as loaded, in place once, and says whether it is. Without it the pods
// get the bridge plugin's own rules, as the config says.
func (m *Manager) nodeMasquerade(ctx context.Context, own *libcni.NetworkConfigList) bool {
	m.masqMu.Lock()
	defer m.masqMu.Unlock()
	if m.masqFor == own {
		return m.masqOK
	}
	ctx, cancel := context.WithTimeout(ctx, m.bounds.op)
	defer cancel()
	err := ensureMasquerade(ctx, own.Name, m.subnet)
	if err != nil {
		m.log.Warn("no node-wide masquerade; pods get the bridge plugin's own rules", "network", own.Name, "err", err)
	}
	if ctx.Err() == nil { // a cancelled caller's try is not the config's
		m.masqFor, m.masqOK = own, err == nil
	}
	return err == nil
}

// logReadiness logs when readiness, or the reason for its absence, changes.
func (m *Manager) logReadiness(err error) {
	switch {
	case err != nil && (m.notReady == nil || err.Error() != m.notReady.Error()):
		m.log.Warn("CNI network not ready", "err", err)
	case err == nil && m.notReady != nil:
		m.log.Info("CNI network ready", "network", m.list.Name)
	}
	m.notReady = err
}

// track marks id busy for GC until the returned func is called.
func (m *Manager) track(id string) (done func()) {
	m.mu.Lock()
	m.busy[id]++
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.busy[id]--; m.busy[id] == 0 {
			delete(m.busy, id)
		}
		m.mu.Unlock()
	}
}

func (m *Manager) isBusy(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.busy[id] > 0
}

// forget drops id from the ledger unless an Add or Del of it has begun
// meanwhile: an Add records it anew, and the record must outlive the Add.
func (m *Manager) forget(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.busy[id] > 0 {
		return nil
	}
	return m.owned.remove(id)
}

// lastList returns the last config that loaded, or nil.
func (m *Manager) lastList() *libcni.NetworkConfigList {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.list
}

// statConfig identifies the first config file in dir; its path is "" if
// there is none.
func statConfig(dir string) (configFile, error) {
	path, err := findConfig(dir)
	if err != nil || path == "" {
		return configFile{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return configFile{}, err
	}
	f := configFile{path: path, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.ino = st.Ino // a config replaced by rename may keep size and mtime
	}
	return f, nil
}

// findConfig returns the first config file in dir, or "" if there is none.
func findConfig(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return "", fmt.Errorf("read config dir %s: %w", dir, err)
	}
	if len(files) == 0 {
		return "", nil
	}
	sort.Strings(files)
	return files[0], nil
}

// loadConfig reads a network config list, or a single plugin config (any
// extension) wrapped into a list of one, and returns it with the file's bytes.
func loadConfig(path string) (*libcni.NetworkConfigList, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, nil, fmt.Errorf("%s: not a JSON object: %w", path, err)
	}
	var list *libcni.NetworkConfigList
	if _, ok := probe["plugins"]; ok {
		list, err = libcni.NetworkConfFromBytes(data)
	} else {
		var conf *libcni.PluginConfig
		if conf, err = libcni.NetworkPluginConfFromBytes(data); err == nil {
			list, err = libcni.ConfListFromConf(conf)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if list.Name == "" {
		return nil, nil, fmt.Errorf("%s: network has no name", path)
	}
	return list, data, nil
}

// checkPlugins fails if a plugin the config names is in no bin dir, so that
// a broken setup shows in Ready rather than halfway through an ADD.
func checkPlugins(path string, list *libcni.NetworkConfigList, binDirs []string) error {
	for _, p := range list.Plugins {
		if _, err := invoke.FindInPath(p.Network.Type, binDirs); err != nil {
			return fmt.Errorf("%s: %w: %q in bin dirs %v", path, ErrPluginNotFound, p.Network.Type, binDirs)
		}
	}
	return nil
}

// DefaultConfig is the conflist noderun writes as its default network: a
// bridge with host-local IPAM, masquerade, hostPort and bandwidth support.
// host-local keeps its leases next to CacheDir rather than in /var/lib/cni,
// so all noderun state sits in its own state dir. (Exported for the bench,
// whose floor runs this very chain whole.)
func DefaultConfig(cfg Config) ([]byte, error) {
	if _, _, err := net.ParseCIDR(cfg.DefaultSubnet); err != nil {
		return nil, fmt.Errorf("cni: default subnet: %w", err)
	}
	type obj = map[string]any
	conf := obj{
		"cniVersion": defaultCNIVersion,
		"name":       defaultNetworkName(cfg.DefaultBridge),
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
			{"type": "bandwidth", "capabilities": obj{"bandwidth": true}},
			{"type": "loopback"},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cni: default config: %w", err)
	}
	return append(data, '\n'), nil
}

// defaultNetworkName is "noderun" on the default bridge, else the bridge's
// name: the network's name is in host-local's lease dir and in the iptables
// comments of its rules, so instances on bridges of their own keep apart.
func defaultNetworkName(bridge string) string {
	if bridge == DefaultBridge {
		return defaultNetName
	}
	return bridge
}

// writeDefaultConfig writes data, the default config, into cfg.ConfDir
// and records it (recordDefault) so that reset removes only what noderun wrote.
func writeDefaultConfig(cfg Config, data []byte) (string, error) {
	path := filepath.Join(cfg.ConfDir, defaultConfName)
	_, statErr := os.Stat(cfg.ConfDir)
	if err := os.MkdirAll(cfg.ConfDir, 0o755); err != nil {
		return "", fmt.Errorf("cni: write default config %s: %w", path, err)
	}
	// A directory made here is noderun's for reset to remove with the file.
	if err := recordDefault(cfg, path, data, errors.Is(statErr, fs.ErrNotExist)); err != nil {
		return "", fmt.Errorf("cni: record default config %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("cni: write default config %s: %w", path, err)
	}
	return path, nil
}

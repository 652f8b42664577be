// Command noderun runs Kubernetes Pod manifests on one machine, without an
// API server, by driving containerd and CNI directly.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	ctrdlog "github.com/containerd/log"
	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/crilog"
	nrcli "github.com/noderun/noderun/internal/cli"
	"github.com/noderun/noderun/kubeapi"
	"github.com/noderun/noderun/systemd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "noderun:", err)
		os.Exit(1)
	}
}

// newApp is the command line; docs/reference/flags.md is generated from it
// (docs_test.go).
func newApp() *cli.App {
	return &cli.App{
		Name:  "noderun",
		Usage: "run Kubernetes Pod manifests on containerd, without an API server",
		Description: "Runs the Pod manifests given by --manifests and --manifest-url, as the kubelet runs static pods.\n" +
			"Documentation: README.md and docs/ in the source, /usr/share/doc/noderun with the package;\n" +
			"every flag and command: docs/reference/flags.md.",
		Version: version,
		Flags:   flags(),
		Action:  longLived(runNode),
		Commands: append([]*cli.Command{
			{Name: "version", Usage: "print the version", Description: "See docs/operating.md, Updates.", Action: func(*cli.Context) error {
				fmt.Println("noderun", version)
				return nil
			}},
			imagesCommand(),
			resetCommand(),
			installCommand(),
			{
				// containerd's shim runs this as the containers' log driver.
				Name: "log-driver", Hidden: true, ArgsUsage: "[MAX-SIZE:MAX-FILES:]PATH",
				// Most hand their pipes to the collector and exit at once;
				// only one writing the log itself lives long enough to trim.
				Action: func(c *cli.Context) error { return crilog.ServeFDs(c.Args().First(), "", trimExecutable) },
			},
			{
				// The node's one log collector, started by noderun (logcollector.go).
				Name: "log-collector", Hidden: true, ArgsUsage: "SOCKET",
				Action: longLived(func(c *cli.Context) error { return runCollector(c.Context, c.Args().First()) }),
			},
			{
				// PID 1 of a pod with shareProcessNamespace (pause.go).
				Name: "pause", Hidden: true, ArgsUsage: "ROOT",
				Action: longLived(func(c *cli.Context) error { return runPause(c.Args().First()) }),
			},
		}, nrcli.Commands()...),
	}
}

// longLived is for the processes that run as long as the node or a pod:
// they first give back the binary pages that starting touched
// (trimExecutable). The commands and a log driver that hands its pipes over
// exit within milliseconds, and the trim (a read of /proc/self/smaps) would
// only delay them; for a driver it delays the container's start.
func longLived(action cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		trimExecutable()
		return action(c)
	}
}

func flags() []cli.Flag {
	env := func(name string) []string { return []string{"NODERUN_" + name} }
	return append([]cli.Flag{
		&cli.StringSliceFlag{Name: "manifests", Usage: "directory or file of Pod manifests (repeatable)", EnvVars: env("MANIFESTS")},
		&cli.StringSliceFlag{Name: "manifest-url", Usage: "http(s) URL of Pod manifests, polled (repeatable)", EnvVars: env("MANIFEST_URL")},
		&cli.DurationFlag{Name: "url-check-interval", Value: defaultRelist, Usage: "poll manifest URLs this often", EnvVars: env("URL_CHECK_INTERVAL")},
		&cli.StringFlag{Name: "node-name", Value: nrcli.DefaultNodeName(), DefaultText: "the hostname, lowercased", Usage: "node name; static pods are named <name>-<node-name>", EnvVars: env("NODE_NAME")},
		&cli.StringFlag{Name: "node-ip", Usage: "the node's IP for status.hostIP (default: the address of the default route's interface)", EnvVars: env("NODE_IP")},
		&cli.StringFlag{Name: "containerd-address", Value: "/run/containerd/containerd.sock", Usage: "the containerd to use; if it does not answer, noderun waits for it", EnvVars: env("CONTAINERD_ADDRESS")},
		&cli.BoolFlag{Name: "containerd-managed", Usage: "run a private containerd under --state-dir and --run-dir instead of using --containerd-address (chosen by itself, once, when no containerd is installed)", EnvVars: env("CONTAINERD_MANAGED")},
		&cli.StringFlag{Name: "containerd-namespace", Value: "noderun", Usage: "containerd namespace for everything noderun creates", EnvVars: env("CONTAINERD_NAMESPACE")},
		&cli.StringFlag{Name: "state-dir", Value: "/var/lib/noderun", Usage: "pod state, volumes, CNI cache, a managed containerd's root", EnvVars: env("STATE_DIR")},
		&cli.StringFlag{Name: "run-dir", Value: "/run/noderun", Usage: "pinned namespaces, runc state, a managed containerd's socket", EnvVars: env("RUN_DIR")},
		&cli.StringFlag{Name: "pod-log-dir", Value: "/var/log/pods", Usage: "container logs", EnvVars: env("POD_LOG_DIR")},
		&cli.StringFlag{Name: "images-dir", Usage: "image tarballs imported at start and when added (default <state-dir>/images)", EnvVars: env("IMAGES_DIR")},
		&cli.StringFlag{Name: "registry-config-dir", Value: "/etc/containerd/certs.d", Usage: "per-registry <host>/hosts.toml (mirrors, TLS, capabilities), as containerd's config_path", EnvVars: env("REGISTRY_CONFIG_DIR")},
		&cli.StringSliceFlag{Name: "registry-auth-file", Usage: "docker config.json with registry credentials; the first that exists is used (default <state-dir>/config.json, /root/.docker/config.json)", EnvVars: env("REGISTRY_AUTH_FILE")},
		&cli.DurationFlag{Name: "image-pull-progress-timeout", Value: time.Minute, Usage: "cancel a pull that received nothing for this long (0: never)", EnvVars: env("IMAGE_PULL_PROGRESS_TIMEOUT")},
		&cli.StringFlag{Name: "container-log-max-size", Value: "10Mi", Usage: "rotate a container's log at this size, as the kubelet's containerLogMaxSize (0: never)", EnvVars: env("CONTAINER_LOG_MAX_SIZE")},
		&cli.IntFlag{Name: "container-log-max-files", Value: 5, Usage: "log files kept per container run, the current one included (at least 2), as the kubelet's containerLogMaxFiles", EnvVars: env("CONTAINER_LOG_MAX_FILES")},
		&cli.IntFlag{Name: "image-gc-high-threshold", Value: 85, Usage: "remove unused images when the image filesystem is this full (percent)", EnvVars: env("IMAGE_GC_HIGH_THRESHOLD")},
		&cli.IntFlag{Name: "image-gc-low-threshold", Value: 80, Usage: "... down to this (percent)", EnvVars: env("IMAGE_GC_LOW_THRESHOLD")},
		&cli.DurationFlag{Name: "image-minimum-gc-age", Value: 2 * time.Minute, Usage: "an image seen for less time is never removed", EnvVars: env("IMAGE_MINIMUM_GC_AGE")},
		&cli.DurationFlag{Name: "image-gc-period", Value: 5 * time.Minute, Usage: "how often image garbage collection looks (0: never)", EnvVars: env("IMAGE_GC_PERIOD")},
		&cli.StringFlag{Name: "image-pull-fallback", Value: "local", Usage: "local: imagePullPolicy Always runs the local copy when the registry cannot be reached or cannot serve (a warning event); never: fail as the kubelet does", EnvVars: env("IMAGE_PULL_FALLBACK")},
		&cli.StringFlag{Name: "cni-conf-dir", Value: "/etc/cni/net.d", Usage: "CNI configs; the lexicographically first *.conflist, *.conf or *.json is used", EnvVars: env("CNI_CONF_DIR")},
		&cli.StringFlag{Name: "cni-bin-dir", Value: "/opt/cni/bin:/usr/lib/cni", Usage: "CNI plugin search path", EnvVars: env("CNI_BIN_DIR")},
		&cli.StringFlag{Name: "pod-cidr", Value: "10.244.77.0/24", Usage: "subnet of the default CNI config, used when --cni-conf-dir has none", EnvVars: env("POD_CIDR")},
		&cli.StringFlag{Name: "cgroup-driver", Value: "cgroupfs", Usage: "cgroupfs or systemd, as the kubelet's cgroupDriver (match containerd's and the host's: systemd on a systemd host)", EnvVars: env("CGROUP_DRIVER")},
		&cli.StringFlag{Name: "pod-bridge", Value: "noderun0", Usage: "bridge of the default CNI config", EnvVars: env("POD_BRIDGE")},
		&cli.StringSliceFlag{Name: "allowed-unsafe-sysctls", Usage: "sysctls pods may set beyond the kubelet's safe set: names or prefixes ending in * (repeatable, comma-separated), as the kubelet's allowedUnsafeSysctls", EnvVars: env("ALLOWED_UNSAFE_SYSCTLS")},
		&cli.StringFlag{Name: "resolv-conf", Value: "/etc/resolv.conf", Usage: "resolv.conf for pods with dnsPolicy Default", EnvVars: env("RESOLV_CONF")},
		&cli.StringFlag{Name: "status-socket", Usage: "status API socket (default <run-dir>/noderun.sock)", EnvVars: env("STATUS_SOCKET")},
		&cli.DurationFlag{Name: "network-check-interval", Value: 30 * time.Minute, Usage: "CNI CHECK each running pod this often (0: only after a restart and when its interfaces vanish)", EnvVars: env("NETWORK_CHECK_INTERVAL")},
		&cli.DurationFlag{Name: "file-check-interval", Value: defaultRelist, Usage: "re-list manifest directories this often (a safety net for missed events)", EnvVars: env("FILE_CHECK_INTERVAL")},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: env("LOG_LEVEL")},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text, json or journal (fields of their own); unset, journal when stderr is the journal (JOURNAL_STREAM), else text", EnvVars: env("LOG_FORMAT")},
	}, append(nrcli.URLFlags(), apiFlags()...)...)
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	// The containerd client logs through logrus (e.g. every failed pull
	// attempt at info level); our own log says what matters.
	_ = ctrdlog.SetLevel("warn")
	opts := &slog.HandlerOptions{Level: level}
	format := c.String("log-format")
	if !c.IsSet("log-format") && systemd.StderrIsJournal() {
		format = "journal"
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "journal":
		return slog.New(systemd.NewJournalHandler(level, "noderun", nil, slog.NewTextHandler(os.Stderr, opts))), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text, json or journal", format)
}

// statusSocket resolves the API socket path from flags.
func statusSocket(c *cli.Context) string {
	if s := c.String("status-socket"); s != "" {
		return s
	}
	return kubeapi.StatusSocket(c.String("run-dir"))
}

package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/typeurl/v2"
	"github.com/distribution/reference"
	"github.com/moby/sys/signal"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sync/singleflight"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/crilog"
	"github.com/noderun/noderun/internal/cgroups"
	"github.com/noderun/noderun/runner"
)

// Runtime drives containerd for the sync engine.
type Runtime struct {
	client       *ctrd.Client
	address      string // containerd's socket, see WithAddress
	namespace    string
	snapshotter  string
	snapRootMu   sync.Mutex // snapRoot: the snapshotter's root, once known
	snapRoot     string
	runcRoot     string // private runc state root, so several containerds never share one
	fifoDir      string // exec FIFOs, next to runcRoot rather than in containerd's /run/containerd/fifo
	stdioRoot    string // containers' stdin (and output) FIFOs, next to fifoDir (stdio.go)
	logDriver    string // absolute path of the program containerd runs as log driver
	logRotation  crilog.Rotation
	logCollector string    // the collector's socket; "": one driver process per container
	podLogDir    string    // below it the log driver follows no link; "": the log's own dir
	oomFloor     int       // see OOMScoreFloor
	oomClamped   sync.Once // the warning that scores were raised to oomFloor
	pullFallback bool      // Always may run the local copy when the registry is unreachable
	registry     RegistryConfig
	pulls        pullGroup
	refresh      refresher
	ledger       *ImportLedger // images from the images dir, kept by image GC
	use          imageUse
	security     hostSecurity
	// rootfsInside: runc mounts a container's rootfs in its own mount
	// namespace (rootfs.go), which runc 1.2 and later refuse.
	rootfsInside bool
	rro          bool   // runc can make recursive read-only mounts (rro.go)
	userns       bool   // pods can have user namespaces (userns.go)
	usernsWhy    string // what the probe found
	cgroups      cgroups.Layout
	shimGroups   int // pods spread over this many shims; 0: one per container
	log          *slog.Logger

	// What an image digest always yields, so starting the next container
	// of an image costs no content reads and no rootfs mount.
	mu     sync.Mutex
	images map[string]imageFacts // by image digest
	users  map[string]specs.User // by digest and user settings
	// groupTurns hold each shim group's task creates to one at a time
	// (groupTurn), by groupIndex.
	groupTurns map[uint32]chan struct{}
	// One lookup of a user key at a time, shared by the containers that
	// wait for it: a burst of pods of one image would otherwise mount the
	// rootfs of each (twice: passwd, then group) before the first result
	// is cached.
	userFlight singleflight.Group

	leaseStock leaseStock
}

// imageFacts is what containers need from an image that never changes for
// one digest.
type imageFacts struct {
	cfg     runner.ImageConfig
	chainID string // the unpacked rootfs, parent of every container's snapshot
}

var _ runner.Runtime = (*Runtime)(nil)

// Option configures a Runtime.
type Option func(*Runtime)

// WithAddress names the containerd socket the runtime's client talks to,
// by which its shims are found (shutdownOrphanShim).
func WithAddress(a string) Option { return func(r *Runtime) { r.address = a } }

// WithSnapshotter selects the snapshotter (default overlayfs).
func WithSnapshotter(s string) Option { return func(r *Runtime) { r.snapshotter = s } }

// WithSeccompDir sets the directory of Localhost seccomp profiles, the
// kubelet's <root-dir>/seccomp; noderun passes <state-dir>/seccomp.
func WithSeccompDir(dir string) Option { return func(r *Runtime) { r.security.seccompDir = dir } }

// WithPullFallback lets imagePullPolicy Always run the local copy of an
// image when its registry cannot be reached (not when it refuses).
func WithPullFallback(on bool) Option { return func(r *Runtime) { r.pullFallback = on } }

// WithImportLedger tells image GC which images came from tarballs in the
// images dir.
func WithImportLedger(l *ImportLedger) Option { return func(r *Runtime) { r.ledger = l } }

// WithLogRotation has the log driver rotate each container's log.
func WithLogRotation(rot crilog.Rotation) Option { return func(r *Runtime) { r.logRotation = rot } }

// WithCgroups sets the cgroup driver and hierarchy (default: cgroupfs on
// this host's).
func WithCgroups(l cgroups.Layout) Option { return func(r *Runtime) { r.cgroups = l } }

// WithLogCollector has each log driver hand its container's output to the
// node's collector at sock and exit.
func WithLogCollector(sock string) Option { return func(r *Runtime) { r.logCollector = sock } }

// WithPodLogDir names the directory that holds the container logs: the
// log driver follows no link below it.
func WithPodLogDir(dir string) Option { return func(r *Runtime) { r.podLogDir = dir } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(r *Runtime) { r.log = l } }

// New returns a Runtime using client in namespace ns. logDriver is the
// program containerd runs as `<logDriver> log-driver <target>` (crilog):
// the driver noderun embeds, or noderun's binary.
// runcRoot's parent, noderun's run directory, also holds exec FIFOs and
// containers' stdio FIFOs.
func New(client *ctrd.Client, ns, runcRoot, logDriver string, opts ...Option) *Runtime {
	r := &Runtime{
		client:      client,
		namespace:   ns,
		snapshotter: "overlayfs",
		runcRoot:    runcRoot,
		fifoDir:     filepath.Join(filepath.Dir(runcRoot), "exec-fifo"),
		stdioRoot:   filepath.Join(filepath.Dir(runcRoot), "stdio"),
		logDriver:   logDriver,
		oomFloor:    OOMScoreFloor(),
		cgroups:     cgroups.Detect(cgroups.Cgroupfs),
		log:         slog.New(slog.DiscardHandler),
		images:      map[string]imageFacts{},
		users:       map[string]specs.User{},
	}
	for _, o := range opts {
		o(r)
	}
	r.security = detectHostSecurity(r.security.seccompDir)
	var runc string
	r.rootfsInside, runc = runcMountsRootInside(context.Background())
	r.log.Debug("container root filesystems", "mounted_by_runc_inside", r.rootfsInside, "runc", runc)
	features := readRuncFeatures(context.Background())
	r.rro = features.recursiveReadOnly()
	r.userns, r.usernsWhy = r.probeUserNamespaces(features)
	r.log.Debug("pod user namespaces", "supported", r.userns, "why", r.usernsWhy)
	return r
}

// UseTempMountDir has containerd's client mount image rootfs (to read their
// passwd and group files) under dir rather than /tmp, and removes the
// mounts a noderun killed meanwhile left there: under /tmp nobody would,
// and each keeps its snapshot busy. In the run dir, a tmpfs, the mount
// points cost no disk writes either. Call it with the run dir locked,
// before any container is created.
func UseTempMountDir(dir string) (warnings []error, err error) {
	if err := mount.SetTempMountLocation(dir); err != nil {
		return nil, err
	}
	return mount.CleanupTempMounts(0)
}

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.namespace)
}

// Ping reports whether containerd answers.
func (r *Runtime) Ping(ctx context.Context) error {
	_, err := r.client.Version(r.ctx(ctx))
	return err
}

// EnsureImage applies the pull policy and returns the image's config. An
// image digest seen before costs one lookup.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy) (runner.ImageConfig, error) {
	ctx = r.ctx(ctx)
	if err := r.waitForImports(ctx, ref); err != nil {
		return runner.ImageConfig{}, err
	}
	img, pulled, fellBack, err := resolveImage(ctx, r.client, ref, policy, r.pullFallback, r.pull)
	if err != nil {
		return runner.ImageConfig{}, err
	}
	if fellBack != nil {
		r.refreshLater(img.Name())
	}
	digest := img.Target().Digest.String()
	if f, ok := r.imageFacts(digest); ok {
		return withPull(ctx, img, f.cfg, pulled, fellBack), nil
	}
	if !pulled {
		if err := ensureUnpacked(ctx, r.client, img, r.snapshotter); err != nil {
			return runner.ImageConfig{}, err
		}
	}
	cfg, err := ImageConfigOf(ctx, img)
	if err != nil {
		return cfg, err
	}
	cfg.ID = repoDigest(img.Name(), digest)
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return cfg, fmt.Errorf("image %s rootfs: %w", img.Name(), err)
	}
	r.mu.Lock()
	r.images[digest] = imageFacts{cfg: cfg, chainID: identity.ChainID(diffIDs).String()}
	r.mu.Unlock()
	return withPull(ctx, img, cfg, pulled, fellBack), nil
}

// withPull adds what a pull left to say: the size of what was pulled, or
// why the local copy stands in.
// waitForImports says so when ref is not present while the images dir's
// start-up imports are still under way: it may be among them, and must
// not be pulled (an offline node would fail) or reported missing.
func (r *Runtime) waitForImports(ctx context.Context, ref string) error {
	if !r.ledger.importing() {
		return nil
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return nil // resolveImage says why
	}
	if _, err := r.client.GetImage(ctx, named.String()); !errdefs.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("%w: %s is not present yet; the images dir is still being imported", runner.ErrImageImporting, named)
}

func withPull(ctx context.Context, img ctrd.Image, cfg runner.ImageConfig, pulled bool, fellBack error) runner.ImageConfig {
	if fellBack != nil {
		cfg.PullFallback = fellBack.Error()
	}
	if pulled {
		cfg.Size, _ = img.Size(ctx)
	}
	return cfg
}

func (r *Runtime) imageFacts(digest string) (imageFacts, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.images[digest]
	return f, ok
}

// repoDigest formats an image id as the kubelet reports it: name@digest.
func repoDigest(name, digest string) string {
	repo, _, _ := strings.Cut(name, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo + "@" + digest
}

// StartContainer creates the container and starts its task, and says which
// user it runs as.
func (r *Runtime) StartContainer(ctx context.Context, cfg *runner.ContainerConfig) (runner.Started, error) {
	created, err := r.CreateContainer(ctx, cfg, nil)
	if err != nil {
		return runner.Started{}, err
	}
	return created.Start(ctx)
}

// CreateContainer creates the container and its task (the shim, runc
// create: the process waits in runc init) without starting it. A leftover
// container with the same id (a crash between create and start) is
// replaced. The task is created once ready (if not nil) returned nil.
// Until Start, RemoveContainer discards it; a crash meanwhile leaves a run
// that never started, as a crash between create and start always did.
func (r *Runtime) CreateContainer(ctx context.Context, cfg *runner.ContainerConfig, ready func() error) (runner.CreatedContainer, error) {
	t0 := time.Now()
	if err := r.createContainer(r.ctx(ctx), cfg, ready); err != nil {
		return nil, err
	}
	return &created{r: r, cfg: cfg, began: t0}, nil
}

// created is a container whose task waits to be started.
type created struct {
	r     *Runtime
	cfg   *runner.ContainerConfig
	began time.Time
}

func (c *created) Start(ctx context.Context) (runner.Started, error) {
	at, err := c.r.startTask(c.r.ctx(ctx), c.cfg, c.began)
	if err != nil {
		return runner.Started{}, err
	}
	return runner.Started{User: userFromLabel(c.r.userLabel(c.cfg)), At: at}, nil
}

// createContainer creates the container and, once ready returned nil, its
// task; on error it removes what it made.
func (r *Runtime) createContainer(ctx context.Context, cfg *runner.ContainerConfig, ready func() error) (retErr error) {
	t0 := time.Now()
	facts, ok := r.imageFacts(digestOf(cfg.Image.ID))
	if !ok {
		return fmt.Errorf("image %s: not ensured before starting %s", cfg.Image.Ref, cfg.ID)
	}
	secOpts, err := r.security.securityOpts(cfg)
	if err != nil {
		return err
	}
	for _, k := range legacySeccompAnnotations(cfg.Pod, cfg.Container.Name) {
		r.log.Warn("annotation ignored since Kubernetes 1.27; use securityContext.seccompProfile", "container", cfg.ID, "annotation", k)
	}
	fs := rootfs{insideOK: r.rootfsInside}
	specOpts := append(append(r.specOpts(cfg), secOpts...), fs.specOpt())
	runtimeOpts := r.runtimeOptions()
	newContainer := func() (c ctrd.Container, err error) {
		err = r.withCreateLease(ctx, func(ctx context.Context) error {
			c, err = r.client.NewContainer(ctx, cfg.ID,
				ctrd.WithImageName(cfg.Image.Ref),
				fs.prepare(r.snapshotter, cfg.ID, facts.chainID, remapLabels(cfg.Sandbox)...),
				ctrd.WithRuntime(plugin.RuntimeRuncV2, runtimeOpts),
				ctrd.WithContainerLabels(labelsFor(cfg)),
				ctrd.WithNewSpec(specOpts...),
				r.withUserLabel(cfg))
			return err
		})
		return c, err
	}
	c, err := newContainer()
	if errdefs.IsAlreadyExists(err) {
		if err := r.RemoveContainer(ctx, cfg.ID); err != nil {
			return err
		}
		c, err = newContainer()
	}
	if errdefs.IsNotFound(err) {
		// The image's rootfs went away (image removed and its snapshots
		// collected): look at the image afresh next time.
		r.mu.Lock()
		delete(r.images, digestOf(cfg.Image.ID))
		r.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("create container %s: %w", cfg.ID, err)
	}
	defer r.removeOnError(cfg.ID, &retErr)
	t1 := time.Now()
	if ready != nil {
		if err := ready(); err != nil {
			return fmt.Errorf("create task %s: %w", cfg.ID, err)
		}
	}
	t2 := time.Now()
	stdio, outputs, err := r.taskStdio(cfg)
	if err != nil {
		return err
	}
	done, err := r.groupTurn(ctx, cfg.Sandbox)
	if err == nil {
		err = fs.newTask(ctx, r.client, c, stdio, runtimeOpts)
		done()
	}
	if outputs != nil {
		err = errors.Join(err, r.runDriver(cfg.ID, outputs, err == nil))
	}
	if err != nil {
		return fmt.Errorf("create task %s: %w", cfg.ID, err)
	}
	r.log.Debug("created container", "container", cfg.ID, "create", t1.Sub(t0), "waited", t2.Sub(t1), "task", time.Since(t2))
	return nil
}

// startTask starts a created task and records the start; on error it
// removes the container. It asks containerd's task service itself: a
// ctrd.Task for the created task would cost a round trip to containerd and
// the shim (the client loads it with the task's state), on the path to the
// container's start.
func (r *Runtime) startTask(ctx context.Context, cfg *runner.ContainerConfig, began time.Time) (at time.Time, retErr error) {
	defer r.removeOnError(cfg.ID, &retErr)
	// The shim takes the log driver's exit for readiness and would start
	// the container with no reader, to die of SIGPIPE at its first output.
	// The driver creates the log before it signals ready, so no log means
	// it failed; it said why in syslog.
	if _, err := os.Stat(cfg.LogPath); err != nil {
		return at, fmt.Errorf("log driver for %s: %w (journalctl -t %s tells why)", cfg.ID, err, crilog.SyslogTag)
	}
	t0 := time.Now()
	resp, err := r.client.TaskService().Start(ctx, &tasksapi.StartRequest{ContainerID: cfg.ID})
	if err != nil {
		return at, fmt.Errorf("start task %s: %w", cfg.ID, errdefs.FromGRPC(err))
	}
	at = time.Now()
	r.log.Debug("started task", "container", cfg.ID, "start", at.Sub(t0), "since create", at.Sub(began))
	if err := r.setLabel(ctx, cfg.ID, LabelStarted, startedRecord(resp.Pid, at)); err != nil {
		// The run goes on; only a lost task would be taken for never started,
		// and a restart would report the record's creation as its start.
		r.log.Warn("start not recorded", "container", cfg.ID, "err", err)
	}
	return at, nil
}

// removeOnError removes container id if *err is set when the caller returns.
func (r *Runtime) removeOnError(id string, err *error) {
	if *err == nil {
		return
	}
	cctx, cancel := context.WithTimeout(r.ctx(context.Background()), 30*time.Second)
	defer cancel()
	if rerr := r.RemoveContainer(cctx, id); rerr != nil {
		r.log.Warn("cleanup after failed start", "container", id, "err", rerr)
	}
}

func digestOf(imageID string) string {
	_, d, _ := strings.Cut(imageID, "@")
	return d
}

// specOpts builds the container's spec options. The process user is looked
// up in the image's passwd and group files (a rootfs mount) only the first
// time an image is run with given user settings.
func (r *Runtime) specOpts(cfg *runner.ContainerConfig) []oci.SpecOpts {
	if cfg.OOMScoreAdj < r.oomFloor {
		r.oomClamped.Do(func() {
			r.log.Warn("oom_score_adj raised to noderun's own: without CAP_SYS_RESOURCE no container can be given less; critical and Guaranteed pods are no better protected from the OOM killer than noderun",
				"floor", r.oomFloor, "wanted", cfg.OOMScoreAdj, "pod", cfg.Pod.Name, "container", cfg.Container.Name)
		})
	}
	opts := append(specOpts(cfg, r.oomFloor, r.cgroups), withTerminal(cfg.Container.TTY), r.withShimGroup(cfg.Sandbox))
	key := userKey(cfg)
	r.mu.Lock()
	u, ok := r.users[key]
	r.mu.Unlock()
	if ok {
		return append(opts, withProcessUser(u))
	}
	return append(opts, r.withResolvedUser(key, cfg.User))
}

// withResolvedUser looks the process user up as userOpts do, once for all
// the containers of a key created meanwhile, and caches it. Only a success
// is shared: a container whose leader failed (its pod removed, say) looks
// for itself.
func (r *Runtime) withResolvedUser(key string, u runner.ProcessUser) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		led := false
		v, err, _ := r.userFlight.Do(key, func() (any, error) {
			led = true
			r.mu.Lock()
			user, ok := r.users[key] // by a flight that ended since specOpts looked
			r.mu.Unlock()
			if ok {
				return user, withProcessUser(user)(ctx, cl, c, s)
			}
			if err := oci.ApplyOpts(ctx, unmappedClient{cl}, c, s, userOpts(u)...); err != nil {
				return nil, err
			}
			user = s.Process.User
			user.AdditionalGids = slices.Clone(user.AdditionalGids)
			r.mu.Lock()
			r.users[key] = user
			r.mu.Unlock()
			return user, nil
		})
		switch {
		case led:
			return err // s holds the user already
		case err != nil:
			return oci.ApplyOpts(ctx, unmappedClient{cl}, c, s, userOpts(u)...)
		}
		return withProcessUser(v.(specs.User))(ctx, cl, c, s)
	}
}

// runtimeOptions are runc's: noderun's private state root, and systemd
// managing the cgroups with the systemd driver.
func (r *Runtime) runtimeOptions() *options.Options {
	return &options.Options{Root: r.runcRoot, SystemdCgroup: r.cgroups.Driver == cgroups.Systemd}
}

// withTaskOptions repeats the runtime options on the task so every daemon
// version hands the shim our runc root.
func withTaskOptions(o *options.Options) ctrd.NewTaskOpts {
	return func(_ context.Context, _ *ctrd.Client, ti *ctrd.TaskInfo) error {
		ti.Options = o
		return nil
	}
}

func labelsFor(cfg *runner.ContainerConfig) map[string]string {
	l := map[string]string{
		LabelPodUID:       string(cfg.Pod.UID),
		LabelPodName:      cfg.Pod.Name,
		LabelPodNamespace: cfg.Pod.Namespace,
		LabelContainer:    cfg.Container.Name,
		LabelSpecHash:     cfg.SpecHash,
		LabelRestartCount: strconv.Itoa(cfg.RestartCount),
		LabelImageRef:     cfg.Image.Ref,
		LabelImageID:      cfg.Image.ID,
		LabelLogPath:      cfg.LogPath,
	}
	if cfg.Init {
		l[LabelInit] = "true"
	}
	if cfg.Sandbox != nil && cfg.Sandbox.Epoch != "" {
		l[LabelSandboxEpoch] = cfg.Sandbox.Epoch
	}
	if cfg.Image.StopSignal != "" {
		l[LabelStopSignal] = cfg.Image.StopSignal
	}
	if ls := cfg.LastState; ls != nil {
		l[LabelLastExitCode] = strconv.Itoa(int(ls.ExitCode))
		l[LabelLastReason] = ls.Reason
		l[LabelLastStarted] = ls.StartedAt.UTC().Format(time.RFC3339Nano)
		l[LabelLastFinished] = ls.FinishedAt.UTC().Format(time.RFC3339Nano)
		l[LabelLastID] = ls.ContainerID
	}
	return l
}

// ListContainers returns noderun's containers (all, or one pod's) with the
// state of their tasks, using one task listing for all of them.
func (r *Runtime) ListContainers(ctx context.Context, podUID string) ([]runner.ContainerStatus, error) {
	ctx = r.ctx(ctx)
	filter := ownedFilter
	if podUID != "" {
		filter = fmt.Sprintf(`labels.%q==%q`, LabelPodUID, podUID)
	}
	recs, err := r.client.ContainerService().List(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	if len(recs) == 0 {
		return nil, nil
	}
	procs, err := r.tasks(ctx, recs)
	if err != nil {
		return nil, err
	}
	out := make([]runner.ContainerStatus, 0, len(recs))
	for i := range recs {
		p := procs[recs[i].ID]
		if p != nil && p.Status != tasktypes.Status_CREATED && recs[i].Labels[LabelStarted] == "" {
			// Started by a noderun killed before it recorded the start, or
			// by one from before the record existed.
			if err := r.setLabel(ctx, recs[i].ID, LabelStarted, startedRecord(p.Pid, recs[i].CreatedAt)); err != nil {
				r.log.Warn("start not recorded", "container", recs[i].ID, "err", err)
			}
		}
		st := statusOf(&recs[i], p)
		if rec := exitToRecord(&recs[i], p, &st, time.Now()); rec != "" {
			if err := r.setLabel(ctx, st.ID, LabelExit, rec); err != nil {
				r.log.Warn("exit not recorded", "container", st.ID, "err", err)
			}
		}
		if st.State == runner.StateExited && st.ExitCode == 137 && !st.OOMKilled && r.oomKilledInCgroup(&recs[i]) {
			// The event was missed (noderun was down) or not sent (the
			// kill came before the shim watched the cgroup), or has not
			// come yet: the kernel's count in the cgroup, or its log,
			// says so too.
			st.OOMKilled = true
			_, _ = r.markOOMKilled(ctx, st.ID)
		}
		out = append(out, st)
	}
	return out, nil
}

// oomKilledInCgroup reports whether the kernel's OOM killer killed a process
// in the container's memory cgroup: its count there while the cgroup is
// kept (cgroupfs keeps it until the task is deleted), else the kernel's log
// since the run's process started (systemd removes an emptied scope at
// once).
func (r *Runtime) oomKilledInCgroup(c *containers.Container) bool {
	if c.Spec == nil {
		return false
	}
	v, err := typeurl.UnmarshalAny(c.Spec)
	if err != nil {
		return false
	}
	spec, ok := v.(*specs.Spec)
	if !ok || spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return false
	}
	if n, ok := r.cgroups.OOMKills(spec.Linux.CgroupsPath); ok {
		return n > 0
	}
	p, ok := parseProcID(c.Labels[LabelStarted])
	if !ok || p.boot != bootID || p.start == 0 {
		return false // the log is this boot's; the start is needed to tell runs of one cgroup apart
	}
	return r.cgroups.KernelOOMKill(spec.Linux.CgroupsPath, time.Duration(p.start)*time.Second/userHZ)
}

// userHZ is the unit of /proc's process times (USER_HZ, 100 on Linux).
const userHZ = 100

// tasks fetches task state: one Get per container for a single pod, one
// List for everything (the daemon asks every shim on List).
func (r *Runtime) tasks(ctx context.Context, recs []containers.Container) (map[string]*tasktypes.Process, error) {
	procs := make(map[string]*tasktypes.Process, len(recs))
	if len(recs) > 8 {
		resp, err := r.client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
		if err != nil {
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		for _, p := range resp.Tasks {
			procs[p.ID] = p
		}
		return procs, nil
	}
	for _, c := range recs {
		resp, err := r.client.TaskService().Get(ctx, &tasksapi.GetRequest{ContainerID: c.ID})
		if err := errdefs.FromGRPC(err); errdefs.IsNotFound(err) || errdefs.IsUnavailable(err) {
			// As List does: a dead shim not yet cleaned up is no task
			// here; the run's records tell the rest.
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", c.ID, errdefs.FromGRPC(err))
		}
		procs[c.ID] = resp.Process
	}
	return procs, nil
}

func statusOf(c *containers.Container, p *tasktypes.Process) runner.ContainerStatus {
	l := c.Labels
	rc, _ := strconv.Atoi(l[LabelRestartCount])
	st := runner.ContainerStatus{
		ID:           c.ID,
		PodUID:       l[LabelPodUID],
		PodName:      l[LabelPodName],
		PodNamespace: l[LabelPodNamespace],
		Name:         l[LabelContainer],
		Init:         l[LabelInit] == "true",
		SpecHash:     l[LabelSpecHash],
		RestartCount: rc,
		ImageRef:     l[LabelImageRef],
		ImageID:      l[LabelImageID],
		CreatedAt:    startedAt(c),
		State:        runner.StateCreated,
		LastState:    lastState(l),
		User:         userFromLabel(l[LabelUser]),
		OOMKilled:    l[LabelOOMKilled] == "true",
		Sandbox:      l[LabelSandboxEpoch],
	}
	if p == nil {
		taskless(&st, l)
		return st
	}
	st.PID = p.Pid
	switch p.Status {
	case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		st.State = runner.StateRunning
	case tasktypes.Status_STOPPED:
		st.State = runner.StateExited
		st.ExitCode = int(p.ExitStatus)
		if p.ExitedAt != nil {
			st.FinishedAt = p.ExitedAt.AsTime()
		}
	case tasktypes.Status_CREATED:
		st.State = runner.StateCreated
	default:
		st.State = runner.StateUnknown
	}
	return st
}

func lastState(l map[string]string) *v1.ContainerStateTerminated {
	code, ok := l[LabelLastExitCode]
	if !ok {
		return nil
	}
	ec, _ := strconv.Atoi(code)
	t := &v1.ContainerStateTerminated{ExitCode: int32(ec), Reason: l[LabelLastReason], ContainerID: l[LabelLastID]}
	if ts, err := time.Parse(time.RFC3339Nano, l[LabelLastStarted]); err == nil {
		t.StartedAt.Time = ts
	}
	if ts, err := time.Parse(time.RFC3339Nano, l[LabelLastFinished]); err == nil {
		t.FinishedAt.Time = ts
	}
	return t
}

// StopContainer sends the image's stop signal (SIGTERM by default), waits up
// to grace for the task to exit, then SIGKILLs it. The exited task is kept
// so its exit status can still be read.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	// A shim that does not answer or a process that SIGKILL cannot end
	// (uninterruptible sleep) must not hold the pod's worker for good.
	sctx, cancel := context.WithTimeout(r.ctx(ctx), grace+stopSlack)
	defer cancel()
	err := r.stopContainer(sctx, id, grace)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		return fmt.Errorf("stop %s: gave up after %s (shim not answering, or the process does not die): %w", id, grace+stopSlack, err)
	}
	return err
}

func (r *Runtime) stopContainer(ctx context.Context, id string, grace time.Duration) error {
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		// containerd lost the task; its process may live on untracked.
		labels, lerr := c.Labels(ctx)
		if lerr != nil {
			return fmt.Errorf("load container %s: %w", id, lerr)
		}
		return killLostProcess(ctx, labels)
	} else if err != nil {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil || st.Status == ctrd.Stopped {
		return ignoreNotFound(err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return ignoreNotFound(err)
	}
	sig := syscall.SIGKILL
	if grace > 0 {
		sig = stopSignal(ctx, c)
	}
	if err := task.Kill(ctx, sig); ignoreNotFound(err) != nil {
		return fmt.Errorf("signal %s: %w", id, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
	}
	if err := task.Kill(ctx, syscall.SIGKILL); ignoreNotFound(err) != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopSlack is how long a stop may take beyond its grace period: the
// calls to the shim and the wait after SIGKILL.
var stopSlack = 15 * time.Second

func stopSignal(ctx context.Context, c ctrd.Container) syscall.Signal {
	labels, err := c.Labels(ctx)
	if err != nil || labels[LabelStopSignal] == "" {
		return syscall.SIGTERM
	}
	sig, err := signal.ParseSignal(labels[LabelStopSignal])
	if err != nil {
		return syscall.SIGTERM
	}
	return sig
}

// RemoveContainer deletes the task (killing it if needed), the container and
// its snapshot. Missing pieces are fine: removal is repeated after crashes.
// It runs to its end (or stopSlack) even when ctx ends: a task delete cut
// short (its pod removed meanwhile) can leave containerd without the task
// but its shim running and its bundle in place, which no later removal and
// no stray-shim reaping finds.
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(r.ctx(context.WithoutCancel(ctx)), stopSlack) // as a stop: a hung shim
	defer cancel()
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		// A create cut short after preparing the snapshot (keyed by the
		// container ID) left it without a container record.
		if err := r.client.SnapshotService(r.snapshotter).Remove(ctx, id); ignoreNotFound(err) != nil {
			return fmt.Errorf("remove snapshot %s: %w", id, err)
		}
		return os.RemoveAll(r.stdioDir(id))
	} else if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, ctrd.WithProcessKill); ignoreNotFound(err) != nil {
			return fmt.Errorf("delete task %s: %w", id, err)
		}
	} else if errdefs.IsNotFound(err) {
		r.shutdownOrphanShim(ctx, c)
	} else {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	if err := c.Delete(ctx, ctrd.WithSnapshotCleanup); ignoreNotFound(err) != nil {
		return fmt.Errorf("delete container %s: %w", id, err)
	}
	if err := os.RemoveAll(r.stdioDir(id)); err != nil {
		return fmt.Errorf("remove stdio of %s: %w", id, err)
	}
	return nil
}

// Exits subscribes to containerd's task-exit and OOM events for our
// namespace. Only a container's main process counts as an exit, not exec'd
// processes. An OOM kill is recorded on the container (LabelOOMKilled)
// before the next event is passed on, so a status read after the exit that
// followed it says OOMKilled.
func (r *Runtime) Exits(ctx context.Context) (<-chan runner.ExitEvent, error) {
	ctx = r.ctx(ctx)
	ns := fmt.Sprintf("namespace==%q", r.namespace)
	// Filters given separately are ORed.
	envs, errs := r.client.Subscribe(ctx, `topic=="/tasks/exit",`+ns, `topic=="/tasks/oom",`+ns)
	out := make(chan runner.ExitEvent, 64)
	go func() {
		defer close(out)
		for {
			select {
			case env := <-envs:
				e, ok := r.handleEvent(ctx, env.Event)
				if !ok {
					continue
				}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			case err := <-errs:
				if err != nil && ctx.Err() == nil {
					r.log.Warn("event stream broke", "err", err)
				}
				return
			}
		}
	}()
	return out, nil
}

// handleEvent records an OOM kill, or turns a container's exit into an
// ExitEvent.
func (r *Runtime) handleEvent(ctx context.Context, event typeurl.Any) (runner.ExitEvent, bool) {
	ev, err := typeurl.UnmarshalAny(event)
	if err != nil {
		return runner.ExitEvent{}, false
	}
	switch ev := ev.(type) {
	case *apievents.TaskOOM:
		// The shim's TaskOOM may come after the exit it caused: the pod
		// is synced again so its status says OOMKilled. Before the exit
		// (the usual order) the exit's own event does that.
		if uid, exited := r.markOOMKilled(ctx, ev.ContainerID); exited {
			return runner.ExitEvent{ContainerID: ev.ContainerID, PodUID: uid}, true
		}
	case *apievents.TaskExit:
		if ev.ID != ev.ContainerID {
			return runner.ExitEvent{}, false // an exec'd process
		}
		e := runner.ExitEvent{ContainerID: ev.ContainerID, ExitCode: int(ev.ExitStatus)}
		if ev.ExitedAt != nil {
			e.ExitedAt = ev.ExitedAt.AsTime()
		}
		if rec, err := r.client.ContainerService().Get(ctx, ev.ContainerID); err == nil {
			e.PodUID = rec.Labels[LabelPodUID]
			if e.PodUID != "" && rec.Labels[LabelExit] == "" {
				if err := r.setLabel(ctx, ev.ContainerID, LabelExit, exitRecord(e.ExitCode, e.ExitedAt, "")); err != nil {
					r.log.Warn("exit not recorded", "container", ev.ContainerID, "err", err)
				}
			}
		}
		return e, true
	}
	return runner.ExitEvent{}, false
}

// markOOMKilled labels one of our containers as OOM-killed and, when it
// was not labelled before and its exit is already recorded, says whose pod
// it is. The label is the only record: containerd does not replay events.
func (r *Runtime) markOOMKilled(ctx context.Context, id string) (podUID string, exited bool) {
	svc := r.client.ContainerService()
	rec, err := svc.Get(ctx, id)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			r.log.Warn("OOM kill not recorded", "container", id, "err", err)
		}
		return "", false
	}
	if rec.Labels[LabelPodUID] == "" || rec.Labels[LabelOOMKilled] == "true" {
		return "", false
	}
	if err := r.setLabel(ctx, id, LabelOOMKilled, "true"); err != nil {
		r.log.Warn("OOM kill not recorded", "container", id, "err", err)
		return "", false
	}
	return rec.Labels[LabelPodUID], rec.Labels[LabelExit] != ""
}

func ignoreNotFound(err error) error {
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

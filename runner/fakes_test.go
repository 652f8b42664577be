package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// fakeClock is a manual clock: timers fire only when Advance passes them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *fakeClock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), at: c.now.Add(d), active: true}
	c.timers = append(c.timers, t)
	return t
}

func (c *fakeClock) NewTicker(d time.Duration) clock.Ticker {
	t := c.NewTimer(d).(*fakeTimer)
	c.mu.Lock()
	t.period = d
	c.mu.Unlock()
	return &fakeTicker{t}
}

// Sleep and Tick complete clock.WithTicker; the engine uses neither.
func (c *fakeClock) Sleep(d time.Duration) { <-c.After(d) }

func (c *fakeClock) Tick(d time.Duration) <-chan time.Time { return c.NewTicker(d).C() }

// Advance moves time forward and fires every timer that is due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if t.active && !t.at.After(c.now) {
			t.active = false
			select {
			case t.ch <- c.now:
			default:
			}
			if t.period > 0 {
				t.at, t.active = c.now.Add(t.period), true
			}
		}
	}
}

// timerIn reports whether an active timer fires exactly d from now: a test
// waits for the code under test to arm it before advancing past it.
func (c *fakeClock) timerIn(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.active && t.at.Equal(c.now.Add(d)) {
			return true
		}
	}
	return false
}

type fakeTimer struct {
	c      *fakeClock
	ch     chan time.Time
	at     time.Time
	active bool
	period time.Duration
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at, t.active = t.c.now.Add(d), true
	return was
}

type fakeTicker struct{ *fakeTimer }

func (t *fakeTicker) Stop() { t.fakeTimer.Stop() }

// fakeRuntime keeps containers in memory; tests make them exit.
type fakeRuntime struct {
	mu          sync.Mutex
	clock       clock.WithTicker
	containers  map[string]*ContainerStatus
	started     []*ContainerConfig
	removed     []string // ids RemoveContainer removed, in order
	created     []string // IDs CreateContainer made
	records     []string // IDs CreateContainer recorded, before their task waited for ready
	stopped     []string
	exits       chan ExitEvent
	startErr    error
	stopGate    chan struct{} // when set, stops wait for it to close
	stopHangs   bool          // a stop leaves the run Unknown and fails, as with a stalled shim
	exitsBroken bool
	pingErr     error
	exitsCalls  int
	execs       []execCall
	execResult  ExecResult // what every ExecSync returns
	execErr     error
	calls       []string                 // "exec <id> <cmd>", "stop <id> <grace>", in order
	imagePulls  bool                     // EnsureImage pulls (tells the PullTrace)
	imageErr    error                    // what EnsureImage fails with
	imageErrOf  map[string]error         // ... for one image
	pullGate    map[string]chan struct{} // a pull of the image waits for it to close
	ensures     int                      // EnsureImage calls
	neverChecks int                      // EnsureImage calls with PullNever
	listGate    chan struct{}            // when set, a pod's listing waits for it to close
	lists       int                      // ListContainers calls for one pod
	listsOf     map[string]int           // ... by pod UID
	// ListContainers and EnsureImage calls made before each start.
	listsAtStart, ensuresAtStart []int
	gcKeep                       []string // what the last GCImages had to keep
	// "mount <pod> <ref>" and "remove-image-volumes <pod>", in order;
	// a mount makes dir/<ref> holding the directory sub and the file file.
	imageVolumeCalls []string
	mountErr         error // what MountImageVolume fails with
}

// execCall is one ExecSync the fake received.
type execCall struct {
	ID      string
	Cmd     []string
	Timeout time.Duration
}

func newFakeRuntime(clock clock.WithTicker) *fakeRuntime {
	return &fakeRuntime{clock: clock, containers: map[string]*ContainerStatus{}, exits: make(chan ExitEvent, 16)}
}

// EnsureImage: with imagePulls the image is not at hand, so policy Never
// fails; ensures counts the calls that may pull.
func (r *fakeRuntime) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy) (ImageConfig, error) {
	r.mu.Lock()
	pull, err, gate := r.imagePulls, r.imageErr, r.pullGate[ref]
	if e := r.imageErrOf[ref]; e != nil {
		err = e
	}
	if policy == v1.PullNever && pull {
		r.mu.Unlock()
		return ImageConfig{}, ErrImageNeverPull
	}
	if policy != v1.PullNever {
		r.ensures++
	} else {
		r.neverChecks++
	}
	r.mu.Unlock()
	if pull {
		PullStarted(ctx, ref)
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ImageConfig{}, ctx.Err()
		}
	}
	if err != nil {
		return ImageConfig{}, err
	}
	return ImageConfig{Ref: "docker.io/library/" + ref, Entrypoint: []string{"/entry"}, Cmd: []string{"default"}, Size: 1234}, nil
}

func (r *fakeRuntime) ListContainers(_ context.Context, podUID string) ([]ContainerStatus, error) {
	r.mu.Lock()
	if gate := r.listGate; gate != nil && podUID != "" {
		r.mu.Unlock()
		<-gate
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	if podUID != "" {
		r.lists++
		if r.listsOf == nil {
			r.listsOf = map[string]int{}
		}
		r.listsOf[podUID]++
	}
	var out []ContainerStatus
	for _, c := range r.containers {
		if podUID == "" || c.PodUID == podUID {
			out = append(out, *c)
		}
	}
	return out, nil
}

func (r *fakeRuntime) StartContainer(_ context.Context, cfg *ContainerConfig) (Started, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.startErr != nil {
		return Started{}, r.startErr
	}
	// A leftover that never started is replaced, as the real one does.
	if c, dup := r.containers[cfg.ID]; dup && c.State != StateCreated {
		return Started{}, fmt.Errorf("container %s exists", cfg.ID)
	}
	r.started = append(r.started, cfg)
	r.containers[cfg.ID] = &ContainerStatus{
		ID: cfg.ID, PodUID: string(cfg.Pod.UID), PodName: cfg.Pod.Name, PodNamespace: cfg.Pod.Namespace,
		Name: cfg.Container.Name, Init: cfg.Init, SpecHash: cfg.SpecHash, RestartCount: cfg.RestartCount,
		State: StateRunning, CreatedAt: r.clock.Now(), LastState: cfg.LastState, Sandbox: cfg.Sandbox.Epoch, ImageRef: cfg.Image.Ref,
		PID: uint32(1000 + len(r.started)),
	}
	return Started{At: r.containers[cfg.ID].CreatedAt}, nil
}

// CreateContainer makes a container whose task waits: it lists as
// created, and counts as started (in r.started) only once started. The
// record (in r.records) comes before ready; a failed ready leaves nothing.
func (r *fakeRuntime) CreateContainer(_ context.Context, cfg *ContainerConfig, ready func() error) (CreatedContainer, error) {
	r.mu.Lock()
	if r.startErr != nil {
		r.mu.Unlock()
		return nil, r.startErr
	}
	if _, dup := r.containers[cfg.ID]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("container %s exists", cfg.ID)
	}
	r.records = append(r.records, cfg.ID)
	r.mu.Unlock()
	if ready != nil {
		if err := ready(); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, cfg.ID)
	r.containers[cfg.ID] = &ContainerStatus{
		ID: cfg.ID, PodUID: string(cfg.Pod.UID), PodName: cfg.Pod.Name, PodNamespace: cfg.Pod.Namespace,
		Name: cfg.Container.Name, Init: cfg.Init, SpecHash: cfg.SpecHash, RestartCount: cfg.RestartCount,
		State: StateCreated, CreatedAt: r.clock.Now(), LastState: cfg.LastState, Sandbox: cfg.Sandbox.Epoch, ImageRef: cfg.Image.Ref,
	}
	return &fakeCreated{r, cfg}, nil
}

type fakeCreated struct {
	r   *fakeRuntime
	cfg *ContainerConfig
}

func (c *fakeCreated) Start(context.Context) (Started, error) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	run := r.containers[c.cfg.ID]
	if run == nil || run.State != StateCreated {
		return Started{}, fmt.Errorf("container %s: not created", c.cfg.ID)
	}
	r.started = append(r.started, c.cfg)
	r.listsAtStart, r.ensuresAtStart = append(r.listsAtStart, r.lists), append(r.ensuresAtStart, r.ensures)
	run.State, run.CreatedAt, run.PID = StateRunning, r.clock.Now(), uint32(1000+len(r.started))
	return Started{At: run.CreatedAt}, nil
}

func (r *fakeRuntime) StopContainer(_ context.Context, id string, grace time.Duration) error {
	if r.stopGate != nil {
		<-r.stopGate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = append(r.stopped, id)
	r.calls = append(r.calls, fmt.Sprintf("stop %s %s", id, grace))
	if c := r.containers[id]; c != nil && r.stopHangs {
		c.State = StateUnknown
		return fmt.Errorf("stop %s: gave up (shim not answering)", id)
	}
	if c := r.containers[id]; c != nil && c.State == StateRunning {
		c.State, c.ExitCode, c.FinishedAt = StateExited, 137, r.clock.Now()
	}
	return nil
}

func (r *fakeRuntime) RemoveContainer(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.containers[id]; ok {
		r.removed = append(r.removed, id)
	}
	delete(r.containers, id)
	return nil
}

func (r *fakeRuntime) Exits(context.Context) (<-chan ExitEvent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exitsCalls++
	if r.exitsBroken {
		ch := make(chan ExitEvent)
		close(ch) // containerd gone: the stream ends at once
		return ch, nil
	}
	return r.exits, nil
}

func (r *fakeRuntime) ExecSync(_ context.Context, id string, cmd []string, timeout time.Duration) (ExecResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.execs = append(r.execs, execCall{ID: id, Cmd: cmd, Timeout: timeout})
	r.calls = append(r.calls, fmt.Sprintf("exec %s %s", id, strings.Join(cmd, " ")))
	return r.execResult, r.execErr
}

func (r *fakeRuntime) GCImages(_ context.Context, keep []string, _ ImageGCPolicy) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gcKeep = keep
	return nil, nil
}

func (r *fakeRuntime) MountImageVolume(_ context.Context, podUID, ref, dir string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.imageVolumeCalls = append(r.imageVolumeCalls, "mount "+podUID+" "+ref)
	if r.mountErr != nil {
		return "", r.mountErr
	}
	target := filepath.Join(dir, ref)
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		return "", err
	}
	return target, os.WriteFile(filepath.Join(target, "file"), nil, 0o644)
}

func (r *fakeRuntime) RemoveImageVolumes(_ context.Context, podUID string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.imageVolumeCalls = append(r.imageVolumeCalls, "remove-image-volumes "+podUID)
	return nil
}

func (r *fakeRuntime) Ping(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pingErr
}

// exit makes a running container exit with code and reports the event.
func (r *fakeRuntime) exit(id string, code int) {
	r.mu.Lock()
	c := r.containers[id]
	c.State, c.ExitCode, c.FinishedAt = StateExited, code, r.clock.Now()
	uid := c.PodUID
	r.mu.Unlock()
	r.exits <- ExitEvent{ContainerID: id, PodUID: uid, ExitCode: code}
}

func (r *fakeRuntime) callLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// count is the length of one of r's ID lists, read under its lock.
func (r *fakeRuntime) count(ids *[]string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(*ids)
}

func (r *fakeRuntime) startedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.started)
}

// fakeNetwork hands out one IP per pod and records teardowns.
type fakeNetwork struct {
	mu         sync.Mutex
	setups     map[string]int
	adopted    map[string]bool // pods whose sandbox exists: Setup is not fresh
	broken     map[string]bool
	checkErr   error // what Check returns for a pod that is not broken
	setupErr   error
	gcKeep     map[string]bool
	gcBlock    chan struct{} // if not nil, GC returns only once it is closed
	deepChecks int
	teardowns  []string
	tearErr    error // what Teardown fails with
	pins       int
	pinGate    chan struct{} // when set, Pin waits for it to close
	pinErr     error         // what Pin fails with
	setupGate  chan struct{} // when set, Setup waits for it to close
}

func (n *fakeNetwork) Setup(_ context.Context, sb *Sandbox) ([]string, bool, error) {
	n.mu.Lock()
	gate := n.setupGate
	n.mu.Unlock()
	if gate != nil {
		<-gate
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.setups == nil {
		n.setups = map[string]int{}
	}
	if n.setupErr != nil && !sb.HostNetwork {
		return nil, false, n.setupErr
	}
	n.setups[sb.PodUID]++
	fresh := !n.adopted[sb.PodUID]
	if n.adopted == nil {
		n.adopted = map[string]bool{}
	}
	n.adopted[sb.PodUID] = true
	return []string{"10.0.0.2"}, fresh, nil
}

func (n *fakeNetwork) Pin(context.Context, *Sandbox) error {
	n.mu.Lock()
	gate := n.pinGate
	n.mu.Unlock()
	if gate != nil {
		<-gate
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pins++
	return n.pinErr
}

func (n *fakeNetwork) Check(_ context.Context, sb *Sandbox, deep bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if deep {
		n.deepChecks++
	}
	if n.broken[sb.PodUID] {
		return ErrSandboxBroken
	}
	return n.checkErr
}

func (n *fakeNetwork) GC(ctx context.Context, keep map[string]bool) error {
	n.mu.Lock()
	n.gcKeep = keep
	block := n.gcBlock
	n.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
		}
	}
	return nil
}

func (n *fakeNetwork) setupCount(uid string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.setups[uid]
}

func (n *fakeNetwork) lastGCKeep() map[string]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gcKeep
}

// breakSandbox makes the next Check of the pod fail, until its next Setup.
func (n *fakeNetwork) breakSandbox(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.broken == nil {
		n.broken = map[string]bool{}
	}
	n.broken[uid] = true
	delete(n.adopted, uid)
}

func (n *fakeNetwork) Teardown(_ context.Context, sb *Sandbox) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.teardowns = append(n.teardowns, sb.PodUID)
	delete(n.broken, sb.PodUID)
	return n.tearErr
}

func (n *fakeNetwork) tornDown() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.teardowns...)
}

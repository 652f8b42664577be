package containerd

import (
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"go/version"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd"
	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/defaults"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/ttrpc"
	"github.com/prometheus/procfs"
	"google.golang.org/protobuf/types/known/emptypb"
)

// A noderun killed while containerd deletes a task can leave that task's
// shim running: containerd has deleted the task and its bundle but never
// told the shim to shut down, and nothing ever will. ReapStrayShims ends
// such shims at start, while the single-instance lock keeps every other
// noderun out of the namespace.

// shimBinary is the runtime noderun runs containers with.
const shimBinary = "containerd-shim-runc-v2"

// shimGroupAnnotation names, in a container's spec, the group of tasks one
// runc v2 shim serves.
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// pollInterval paces the wait for a killed shim to be gone.
const pollInterval = 50 * time.Millisecond

// groupAnnotations are the annotations the shim groups by, in the order it
// reads them (containerd's runtime/v2/runc manager).
var groupAnnotations = []string{shimGroupAnnotation, "io.kubernetes.cri.sandbox-id"}

// shimProc is a running shim process.
type shimProc struct {
	pid     int
	args    []string // its command line, which pin checks again
	id      string   // the task it was started for
	address string   // containerd's, as the shim was given it
	sockets []string // the paths it listens on
}

// ReapStrayShims kills the runc v2 shims of namespace ns on the containerd
// at address (as the shims' -address names it, symlinks resolved) that
// serve no task containerd lists and whose bundle containerd has deleted,
// and says how many it ended: killed, or asked to let go of the tasks of
// containers containerd lists without one, after which they exit. Shims of
// other daemons and namespaces are never looked at.
//
// A task's shim is the one listening where containerd's shim package puts
// the socket of the task's group (shimSocket). When a task whose process
// runs has no shim listening there, that rule is not this daemon's, and
// no shim is judged.
func ReapStrayShims(ctx context.Context, c *ctrd.Client, address, ns string, log *slog.Logger) (int, error) {
	shims, err := findShims(canonicalAddress(address), ns)
	if err != nil || len(shims) == 0 {
		return 0, err
	}
	listed, idle, err := listTaskGroups(namespaces.WithNamespace(ctx, ns), c)
	if err != nil {
		return 0, err
	}
	listening := map[string]bool{}
	for _, s := range shims {
		for _, sock := range s.sockets {
			listening[sock] = true
		}
	}
	// Each task's socket, by every address the shims were given.
	served := map[string]bool{}
	for _, t := range listed {
		found := false
		for _, s := range shims {
			sock := shimSocket(s.address, ns, t.group)
			served[sock] = true
			found = found || listening[sock]
		}
		if t.running && !found {
			return 0, fmt.Errorf("no shim listens where running task %s's should: cannot tell which shims serve tasks", t.id)
		}
	}
	n := 0
	for _, s := range shims {
		if len(s.sockets) == 0 || slices.ContainsFunc(s.sockets, func(sock string) bool { return served[sock] }) {
			continue // serving, or not listening where shims do
		}
		if !bundleGone(s.pid) {
			// containerd still holds its bundle: a task it may be creating
			// yet (for the noderun just killed), or one it cleans up itself.
			continue
		}
		released := releaseIdle(ctx, s, ns, idle, log)
		proc, ok := s.pin()
		if !ok {
			if released {
				n++ // it exited once it let go of its tasks
			}
			continue // it went by itself
		}
		if err := proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			proc.Release()
			return n, fmt.Errorf("kill stray shim %d (%s): %w", s.pid, s.id, err)
		}
		log.Info("killed a shim that serves no task", "pid", s.pid, "id", s.id)
		n++
		removeSockets(ctx, s, proc)
		proc.Release()
	}
	return n, nil
}

// releaseIdle has stray shim s let go of the tasks it may hold of
// containers containerd lists without a task (a create cut short), before
// it is killed: a killed shim leaves its tasks' runc containers behind.
// It says whether it asked the shim.
func releaseIdle(ctx context.Context, s shimProc, ns string, idle []taskGroup, log *slog.Logger) bool {
	asked := false
	for _, t := range idle {
		if sock := shimSocket(s.address, ns, t.group); slices.Contains(s.sockets, sock) {
			asked = true
			if held, err := releaseTask(ctx, sock, t.id); err != nil {
				log.Warn("a stray shim's task not deleted", "pid", s.pid, "container", t.id, "err", err)
			} else if held {
				log.Info("deleted a task containerd lost in its stray shim", "pid", s.pid, "container", t.id)
			}
		}
	}
	return asked
}

// taskGroup is a task containerd lists, with the group its shim serves.
type taskGroup struct {
	id, group string
	running   bool // its process runs, so its shim must
}

// listTaskGroups lists the tasks of the context's namespace with their
// groups, read from their containers' specs as the shim reads them, and
// the containers without a task, with theirs.
func listTaskGroups(ctx context.Context, c *ctrd.Client) (listed, idle []taskGroup, err error) {
	resp, err := c.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list tasks: %w", err)
	}
	recs, err := c.ContainerService().List(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list containers: %w", err)
	}
	groups := map[string]string{}
	for _, rec := range recs {
		if rec.Spec == nil {
			continue
		}
		var spec struct {
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.Unmarshal(rec.Spec.GetValue(), &spec); err != nil {
			return nil, nil, fmt.Errorf("spec of container %s: %w", rec.ID, err)
		}
		groups[rec.ID] = shimGroup(rec.ID, spec.Annotations)
	}
	listed = make([]taskGroup, 0, len(resp.Tasks))
	for _, t := range resp.Tasks {
		g := taskGroup{id: t.ID, group: t.ID, running: t.Status == tasktypes.Status_RUNNING || t.Status == tasktypes.Status_PAUSED}
		if group, ok := groups[t.ID]; ok {
			g.group = group
			delete(groups, t.ID)
		}
		listed = append(listed, g)
	}
	for id, group := range groups {
		idle = append(idle, taskGroup{id: id, group: group})
	}
	return listed, idle, nil
}

// shimGroup is the group whose shim serves container id, read from its
// spec's annotations as the shim reads them: the container alone by default.
func shimGroup(id string, annotations map[string]string) string {
	for _, a := range groupAnnotations {
		if g, ok := annotations[a]; ok {
			return g
		}
	}
	return id
}

// removeSockets removes the sockets a killed shim listened on, once it is
// gone; containerd would otherwise find them stale the next time it starts
// a shim there.
func removeSockets(ctx context.Context, s shimProc, proc *os.Process) {
	for deadline := time.Now().Add(5 * time.Second); proc.Signal(syscall.Signal(0)) == nil && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pollInterval):
		}
	}
	for _, sock := range s.sockets {
		os.Remove(sock)
	}
}

// pin holds the shim by a pidfd for a kill: between the scan and the kill
// it may have exited and left its pid to a later process, which the kill
// must not reach. Its command line, read again once pinned, proves the
// pinned process is the one scanned. false: it is gone.
func (s shimProc) pin() (*os.Process, bool) {
	proc, err := os.FindProcess(s.pid)
	if err != nil {
		return nil, false
	}
	again, err := procfs.NewProc(s.pid)
	if err == nil {
		var args []string
		if args, err = again.CmdLine(); err == nil && slices.Equal(args, s.args) {
			return proc, true
		}
	}
	proc.Release()
	return nil, false
}

// shimSocket is where the shim of a group listens: containerd's
// runtime/v2/shim.SocketAddress, whose package would bring the whole shim
// runtime into noderun's binary.
func shimSocket(address, ns, group string) string {
	d := sha256.Sum256([]byte(filepath.Join(address, ns, group)))
	return filepath.Join(shimSocketDir, fmt.Sprintf("%x", d))
}

// findShims lists the shim processes whose command line names namespace ns
// and containerd address (symlinks resolved).
func findShims(address, ns string) ([]shimProc, error) {
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil, err
	}
	paths, err := unixSocketPaths()
	if err != nil {
		return nil, err
	}
	var out []shimProc
	for _, p := range procs {
		args, err := p.CmdLine()
		if err != nil || len(args) == 0 || filepath.Base(args[0]) != shimBinary {
			continue // gone, a kernel thread, or another program
		}
		flags := shimFlags(args[1:])
		if flags["namespace"] == ns && canonicalAddress(flags["address"]) == address {
			out = append(out, shimProc{pid: p.PID, args: args, id: flags["id"], address: flags["address"], sockets: listensOn(p.PID, paths)})
		}
	}
	return out, nil
}

// shimFlags reads a shim's "-name value" arguments.
func shimFlags(args []string) map[string]string {
	flags := map[string]string{}
	for i := 0; i+1 < len(args); i++ {
		if name, ok := strings.CutPrefix(args[i], "-"); ok && !strings.HasPrefix(args[i+1], "-") {
			flags[strings.TrimPrefix(name, "-")] = args[i+1]
			i++
		}
	}
	return flags
}

// canonicalAddress is a containerd socket's path without the unix://
// scheme and with symlinks resolved, so that two names of one socket
// compare equal.
func canonicalAddress(address string) string {
	path := filepath.Clean(strings.TrimPrefix(address, "unix://"))
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	}
	return path
}

// shimSocketDir holds every shim's socket, whatever the daemon's state dir.
var shimSocketDir = filepath.Join(defaults.DefaultStateDir, "s")

// unixSocketPaths maps the inodes of the host's unix sockets bound in
// shimSocketDir to their paths. A shim is not the process that bound its
// socket (its starter did, and passed it on), so SO_PEERCRED cannot tell
// which shim listens where; its descriptors can.
func unixSocketPaths() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/net/unix")
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) == 8 && strings.HasPrefix(f[7], shimSocketDir+"/") {
			paths[f[6]] = f[7]
		}
	}
	return paths, nil
}

// listensOn is the paths in paths of the sockets process pid holds.
func listensOn(pid int, paths map[string]string) []string {
	fds, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if err != nil {
			continue
		}
		inode, ok := strings.CutPrefix(target, "socket:[")
		if path, known := paths[strings.TrimSuffix(inode, "]")]; ok && known && !slices.Contains(out, path) {
			out = append(out, path)
		}
	}
	return out
}

// bundleGone says whether the shim's working directory, the bundle of the
// task it was started for, has been deleted.
func bundleGone(pid int) bool {
	cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd"))
	return err == nil && strings.HasSuffix(cwd, " (deleted)")
}

// shimSignalsByPID reports whether the runc v2 shim on PATH was built with
// a Go older than 1.23 (Debian 12's is 1.19), whose os/exec signals by bare
// PID: such a shim sends SIGTERM to a container's log driver when the task
// is deleted, long after the driver exited, so once the PIDs have wrapped
// (32768 of them go by within a minute on a busy node) another process may
// get it. Go 1.23 signals through a pidfd.
func shimSignalsByPID() (path, goVersion string, byPID bool) {
	path, err := exec.LookPath(shimBinary)
	if err != nil {
		return "", "", false
	}
	goVersion, byPID = builtBefore(path, "go1.23")
	return path, goVersion, byPID
}

// WarnPIDReuse warns when an exited log driver's PID may be reused before
// an old shim signals it (shimSignalsByPID): systemd raises kernel.pid_max
// to 4194304 at boot, other inits leave the kernel's 32768.
func WarnPIDReuse(log *slog.Logger, pidMaxFile string) {
	const enough = 1 << 22
	b, err := os.ReadFile(pidMaxFile)
	if err != nil {
		return
	}
	if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || max >= enough {
		return
	}
	if path, goVersion, byPID := shimSignalsByPID(); byPID {
		log.Warn("the containerd shim signals exited log drivers by PID, and PIDs wrap soon: "+
			"a deleted container's SIGTERM may reach an unrelated process; set kernel.pid_max to 4194304",
			"shim", path, "go", goVersion, "pid_max", strings.TrimSpace(string(b)))
	}
}

// builtBefore reports the Go version binary path was built with and
// whether it is older than v; false when it cannot be read.
func builtBefore(path, v string) (string, bool) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", false
	}
	// Distributions append to it ("go1.19.8", "go1.22.2 X:boringcrypto").
	goVersion, _, _ := strings.Cut(info.GoVersion, " ")
	return goVersion, version.IsValid(goVersion) && version.Compare(goVersion, v) < 0
}

// shutdownOrphanShim has the shim of c's group let go of c and exit, for
// a container whose task containerd no longer lists. containerd deletes a
// task in steps: the shim deletes it, containerd drops it from its list,
// then asks the shim to shut down and removes the bundle. A delete cut
// short between those (noderun killed -9 during it) leaves the shim
// running with its bundle, which ReapStrayShims spares (a task containerd
// may be creating) and nothing else would ever stop. A create cut short
// (noderun killed -9 during it) can leave the task in its shim while
// containerd has dropped it: the shim's reply came after containerd gave
// up, or containerd's delete reached the shim before the create it raced.
// The task holds the shim, its runc container (a runc init in the pod's
// cgroup) and its log driver: with a group's shim, which other pods keep
// running, for as long as the node runs. So the task is killed and
// deleted in the shim, as containerd's cleanup would have, and the shim is
// asked to exit, which it does only when it serves no other task. Best
// effort: what fails is logged.
func (r *Runtime) shutdownOrphanShim(ctx context.Context, c ctrd.Container) {
	if r.address == "" {
		return
	}
	group := c.ID()
	if spec, err := c.Spec(ctx); err == nil {
		group = shimGroup(c.ID(), spec.Annotations)
	}
	shims, err := findShims(canonicalAddress(r.address), r.namespace)
	if err != nil {
		r.log.Warn("shims not looked for", "container", c.ID(), "err", err)
		return
	}
	for _, s := range shims {
		sock := shimSocket(s.address, r.namespace, group)
		if !slices.Contains(s.sockets, sock) {
			continue
		}
		held, err := releaseTask(ctx, sock, c.ID())
		if err != nil {
			r.log.Warn("orphaned shim not shut down", "container", c.ID(), "pid", s.pid, "err", err)
			continue
		}
		if held {
			r.log.Info("deleted a task containerd lost in its shim", "container", c.ID(), "pid", s.pid)
		} else {
			r.log.Info("asked the shim of a task containerd lost to exit", "container", c.ID(), "pid", s.pid)
		}
	}
}

// The task API's services: containerd 2.x's shims serve only v3, 1.6's
// only v2. Their requests and replies are the same messages, so v2's are
// sent by v3's name: the v3 client would bring its API's code into the
// binary for three calls.
const (
	taskServiceV3 = "containerd.task.v3.Task"
	taskServiceV2 = "containerd.task.v2.Task"
)

// releaseTask kills and deletes task id in the shim listening on socket
// (NotFound: it has none), then sends the shim its Shutdown, as containerd
// does after a task delete; a shim that serves other tasks stays. held:
// the shim had the task.
func releaseTask(ctx context.Context, socket, id string) (held bool, err error) {
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "unix", socket)
	if err != nil {
		return false, err
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	service := taskServiceV3
	err = client.Call(ctx, service, "Kill", &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true}, &emptypb.Empty{})
	if errdefs.IsNotImplemented(errdefs.FromGRPC(err)) {
		service = taskServiceV2
		err = client.Call(ctx, service, "Kill", &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true}, &emptypb.Empty{})
	}
	if held, err = deleteTask(ctx, client, service, id); err != nil {
		return held, err
	}
	err = client.Call(ctx, service, "Shutdown", &taskapi.ShutdownRequest{ID: id}, &emptypb.Empty{})
	if errors.Is(err, ttrpc.ErrClosed) {
		return held, nil // it exited before it could answer
	}
	return held, err
}

// deleteTask deletes task id in the shim, once its process is seen dead:
// the shim refuses to delete a running one (with an error of no particular
// code), and sees the kill's exit a moment after the kill.
func deleteTask(ctx context.Context, client *ttrpc.Client, service, id string) (held bool, err error) {
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := client.Call(ctx, service, "Delete", &taskapi.DeleteRequest{ID: id}, &taskapi.DeleteResponse{})
		if err == nil || errdefs.IsNotFound(errdefs.FromGRPC(err)) {
			return err == nil, nil
		}
		if errors.Is(err, ttrpc.ErrClosed) || time.Now().After(deadline) {
			return false, fmt.Errorf("delete task %s in its shim: %w", id, err)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

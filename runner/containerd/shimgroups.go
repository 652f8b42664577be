package containerd

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"syscall"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"

	"github.com/noderun/noderun/runner"
)

// Shared shims (issue 40). A runc v2 shim costs 2.5 MiB of PSS, and one per
// container was half of a 30-pod node's memory. The shim serves every task
// whose spec names its group (shimGroupAnnotation), so noderun spreads the
// pods over a few groups by a hash of their sandbox ID: a pod's containers
// always share one shim, and a node of many pods runs as many shims as it
// has groups. More than one group keeps what one shim's crash or hang takes
// down to a share of the pods, and lets creates run in parallel: the shims
// of containerd 1.6 and 1.7 create one task at a time, holding the lock
// every other call of theirs takes.

// WithShimGroups spreads the pods over n runc v2 shims; 0 gives each
// container a shim of its own.
func WithShimGroups(n int) Option { return func(r *Runtime) { r.shimGroups = n } }

// withShimGroup names the shim group of a container of sandbox sb.
func (r *Runtime) withShimGroup(sb *runner.Sandbox) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if r.shimGroups <= 0 || sb == nil || sb.ID == "" {
			return nil
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[shimGroupAnnotation] = shimGroupName(sb.ID, r.shimGroups, shimBuild())
		return nil
	}
}

// Two task creates of one group at once can leave a shim that serves
// nothing running for as long as the node runs (seen in the VM at the boot
// after a power cut): containerd's shim starter of the second finds the
// group's socket that the first one's bound and, when a connect to it is
// not answered within 100 ms (CanConnect; a slow machine), takes it for a
// dead shim's, removes it and starts a second shim there. Both tasks reach
// the second; the first shim, its socket gone, gets no task and so never
// the Shutdown that would end it. So a group's creates are made one at a
// time. The shims of containerd 1.6 and 1.7 create one task at a time
// anyway; groups still create in parallel.

// groupTurn waits for the turn of sandbox sb's group to create a task,
// and returns the func that ends it.
func (r *Runtime) groupTurn(ctx context.Context, sb *runner.Sandbox) (done func(), err error) {
	if r.shimGroups <= 0 || sb == nil || sb.ID == "" {
		return func() {}, nil
	}
	i := groupIndex(sb.ID, r.shimGroups)
	r.mu.Lock()
	if r.groupTurns == nil {
		r.groupTurns = map[uint32]chan struct{}{}
	}
	turn := r.groupTurns[i]
	if turn == nil {
		turn = make(chan struct{}, 1)
		r.groupTurns[i] = turn
	}
	r.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// groupIndex is the group of sandbox ID sandbox among n, by a hash of it.
func groupIndex(sandbox string, n int) uint32 {
	h := fnv.New32a()
	h.Write([]byte(sandbox))
	return h.Sum32() % uint32(n)
}

// shimGroupName is the group of the pods of sandbox ID sandbox among n
// (groupIndex) with the shim binary's build, so that the tasks created
// after a containerd upgrade get shims of the new binary while the old
// shims serve their tasks until these end.
func shimGroupName(sandbox string, n int, build string) string {
	name := fmt.Sprintf("noderun-%d", groupIndex(sandbox, n))
	if build != "" {
		name += "-" + build
	}
	return name
}

// shimBuild tells one install of the shim binary on PATH from another: its
// inode, size and modification time, hashed. A package upgrade replaces
// the file. "" when there is none on PATH (containerd may find it
// elsewhere; the groups then stay across upgrades).
func shimBuild() string {
	path, err := exec.LookPath(shimBinary)
	if err != nil {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%d:%d:%d:%d", st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano())
	return fmt.Sprintf("%08x", h.Sum32())
}

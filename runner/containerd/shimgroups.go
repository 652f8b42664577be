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

// shimGroupName is the group of the pods of sandbox ID sandbox among n: a
// hash of it, and the shim binary's build, so that the tasks created after
// a containerd upgrade get shims of the new binary while the old shims
// serve their tasks until these end.
func shimGroupName(sandbox string, n int, build string) string {
	h := fnv.New32a()
	h.Write([]byte(sandbox))
	name := fmt.Sprintf("noderun-%d", h.Sum32()%uint32(n))
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

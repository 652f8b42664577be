package containerd

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	ctrd "github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/runner"
)

// withUserLabel records the user the spec resolved, so status can report
// it as containerd's CRI does (containerStatuses[].user.linux), also for
// containers adopted after a restart. It runs after WithNewSpec, which
// leaves the resolved user in the cache.
func (r *Runtime) withUserLabel(cfg *runner.ContainerConfig) ctrd.NewContainerOpts {
	return func(_ context.Context, _ *ctrd.Client, c *containers.Container) error {
		if l := r.userLabel(cfg); l != "" {
			c.Labels[LabelUser] = l
		}
		return nil
	}
}

// userLabel is the cached resolved user of cfg's settings, encoded.
func (r *Runtime) userLabel(cfg *runner.ContainerConfig) string {
	r.mu.Lock()
	u, ok := r.users[userKey(cfg)]
	r.mu.Unlock()
	if !ok {
		return ""
	}
	return encodeUser(u)
}

// encodeUser gives uid:gid:group,group,...
func encodeUser(u specs.User) string {
	groups := make([]string, 0, len(u.AdditionalGids))
	for _, g := range u.AdditionalGids {
		groups = append(groups, strconv.FormatUint(uint64(g), 10))
	}
	return fmt.Sprintf("%d:%d:%s", u.UID, u.GID, strings.Join(groups, ","))
}

// userFromLabel decodes encodeUser's label; containers created before the label
// existed report no user.
func userFromLabel(s string) *v1.LinuxContainerUser {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return nil
	}
	uid, err1 := strconv.ParseInt(parts[0], 10, 64)
	gid, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	u := &v1.LinuxContainerUser{UID: uid, GID: gid}
	for _, g := range strings.Split(parts[2], ",") {
		if id, err := strconv.ParseInt(g, 10, 64); err == nil {
			u.SupplementalGroups = append(u.SupplementalGroups, id)
		}
	}
	return u
}

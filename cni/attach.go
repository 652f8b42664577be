package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/prometheus/procfs"
)

// ErrCheckFailed means a pod's attachment is seen to be broken: its netns,
// or an interface or address of its ADD result, is gone. Recreating the
// sandbox repairs it.
var ErrCheckFailed = errors.New("pod network check failed")

// ifName is the pod's interface, as the kubelet names it.
const ifName = "eth0"

// rollbackTimeout bounds the DEL that undoes a failed ADD; it runs on a fresh
// context because the caller's may be what ended the ADD.
const rollbackTimeout = 30 * time.Second

// Attachment identifies one pod's attachment to the network.
type Attachment struct {
	ID    string // stable sandbox id, passed as CNI_CONTAINERID
	NetNS string // pinned netns file; "" on DEL once it is gone (e.g. after a reboot)

	PodNamespace, PodName, PodUID string
	PortMappings                  []PortMapping
	Bandwidth                     *Bandwidth // nil: no limit
	DNS                           *DNS       // nil: not passed
}

// PortMapping is a hostPort; the JSON names are the CNI portMappings
// capability's.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"` // tcp (default), udp or sctp
	HostIP        string `json:"hostIP,omitempty"`
}

// DNS is the pod's resolver config as the CNI dns capability carries it, for
// plugins that configure DNS themselves.
type DNS struct {
	Servers  []string `json:"servers,omitempty"`
	Searches []string `json:"searches,omitempty"`
	Options  []string `json:"options,omitempty"`
}

// Add attaches the pod (CNI ADD) and returns its IPs, IPv4 first. It first
// reloads the config if it changed, and fails with ErrNetworkNotReady if
// there is no usable one. If any part fails, what was allocated is released
// with a DEL before Add returns.
func (m *Manager) Add(ctx context.Context, a Attachment) (ips []string, retErr error) {
	if a.ID == "" || a.NetNS == "" {
		return nil, fmt.Errorf("cni: add %q: ID and NetNS are required", a.ID)
	}
	list, own, err := m.refresh()
	if err != nil {
		return nil, fmt.Errorf("cni: add %s: %w", a.ID, err)
	}
	full := list
	if own {
		if list, err = podChain(list, a, m.nodeMasquerade(ctx, list)); err != nil {
			return nil, fmt.Errorf("cni: add %s: %w", a.ID, err)
		}
	}
	defer m.track(a.ID)()
	if m.owned.has(a.ID) && !m.Attached(a) {
		if err := m.undoUnfinishedAdd(ctx, a, full); err != nil {
			return nil, err
		}
	}
	if err := m.owned.add(list.Name, a.ID); err != nil {
		return nil, err
	}
	// Registered before the ADD, since ADD may allocate and then fail.
	defer func() {
		if retErr == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if err := m.undo(ctx, a, list); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("rollback: %w", err))
		}
	}()

	addCtx, cancel := context.WithTimeout(ctx, m.bounds.op)
	defer cancel()
	res, err := m.cni.AddNetworkList(addCtx, list, runtimeConf(a))
	if err != nil {
		return nil, fmt.Errorf("cni: add %s to network %q: %w", a.ID, list.Name, whyKilled(addCtx, err))
	}
	ips, err = podIPs(res)
	if err != nil {
		return nil, fmt.Errorf("cni: add %s to network %q: %w", a.ID, list.Name, err)
	}
	m.log.Debug("attached pod", "id", a.ID, "pod", a.PodNamespace+"/"+a.PodName, "ips", ips)
	return ips, nil
}

// undoUnfinishedAdd releases what an ADD of a.ID that never finished made
// (recorded, never cached: a noderun killed during it) before the ADD is
// redone, with the config's whole chain, since which part of it ran is
// not known. The plugins of that ADD outlive noderun and may still run, so
// they are waited for first: an ADD next to them fails on the eth0 they
// made, and its rollback DEL races them and leaves their masquerade rules
// (or their failure releases the new ADD's lease).
func (m *Manager) undoUnfinishedAdd(ctx context.Context, a Attachment, list *libcni.NetworkConfigList) error {
	ctx, cancel := context.WithTimeout(ctx, m.bounds.op)
	defer cancel()
	for pids := pluginsOf(a.ID); len(pids) > 0; pids = pluginsOf(a.ID) {
		m.log.Info("waiting for the plugins of an unfinished ADD", "id", a.ID, "pids", pids)
		select {
		case <-ctx.Done():
			return fmt.Errorf("cni: add %s: plugins %v of an unfinished ADD still run: %w", a.ID, pids, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := m.undo(ctx, a, list); err != nil {
		return fmt.Errorf("cni: add %s: release what an unfinished ADD made: %w", a.ID, err)
	}
	return nil
}

// undo releases what an ADD that did not complete made, with a DEL run
// twice if need be: one may fail after releasing nearly everything (bridge
// 1.1.1 does when the ADD failed before it made its masquerade rules), and
// the next then succeeds.
func (m *Manager) undo(ctx context.Context, a Attachment, list *libcni.NetworkConfigList) error {
	if err := m.del(ctx, a, list); err == nil {
		return nil
	}
	return m.del(ctx, a, list)
}

// pluginsOf returns the processes that run a CNI command for container
// id: the environment libcni gives a plugin names it.
func pluginsOf(id string) []int {
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	var pids []int
	for _, p := range procs {
		if env, err := p.Environ(); err == nil && slices.Contains(env, "CNI_CONTAINERID="+id) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// Del detaches the pod (CNI DEL). It uses the config and arguments libcni
// cached at ADD when present, so the DEL matches the ADD even if the config
// file changed or broke since. Repeating it, or calling it for a pod never
// attached or whose netns is gone, succeeds. Call it before
// RemoveNamespaces, so that the plugins also remove the pod's interface.
func (m *Manager) Del(ctx context.Context, a Attachment) error {
	if a.ID == "" {
		return errors.New("cni: delete: ID is required")
	}
	defer m.track(a.ID)()
	return m.del(ctx, a, m.lastList())
}

// del runs a DEL for each network the cache holds the attachment in, or,
// with nothing cached (a crash mid-ADD), with fallback if not nil.
func (m *Manager) del(ctx context.Context, a Attachment, fallback *libcni.NetworkConfigList) error {
	ctx, cancel := context.WithTimeout(ctx, m.bounds.op)
	defer cancel()
	netns, err := liveNetNS(a.NetNS)
	if err != nil {
		return fmt.Errorf("cni: delete %s: %w", a.ID, err)
	}
	cached, err := m.cni.GetCachedAttachments(a.ID)
	if err != nil {
		// A broken cache must not block the release; the current config
		// is the best remaining guess.
		m.log.Warn("ignoring unreadable CNI cache", "id", a.ID, "err", err)
	}
	var strays []string
	if netns == "" {
		strays = m.hostInterfaces(cached) // DEL forgets them
	}
	var networks []string
	var errs []error
	for _, c := range cached {
		list, err := m.delCached(ctx, c, netns, fallback)
		errs = append(errs, err)
		if list != nil && usesNAT(list) {
			networks = append(networks, list.Name)
		}
	}
	if len(cached) == 0 && fallback != nil {
		rt := runtimeConf(a)
		rt.NetNS = netns
		if err := m.cni.DelNetworkList(ctx, fallback, rt); err != nil {
			errs = append(errs, fmt.Errorf("cni: delete %s from network %q: %w", a.ID, fallback.Name, whyKilled(ctx, err)))
		}
		if usesNAT(fallback) {
			networks = append(networks, fallback.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := removeStrayVeths(strays); err != nil {
		return err
	}
	if len(networks) > 0 && netns == "" {
		// The bridge plugin finds the pod's masquerade rules through its
		// interface, so it leaves them behind once the veth or the netns
		// is gone: a reboot clears them, a deleted veth does not. With the
		// netns alive the plugin removed them; sweeping anyway would list
		// the whole nat table on every DEL (quadratic in a burst). A caller
		// that knows the pod's veth is gone passes no NetNS.
		owned := func(o natOwner) bool { return o.id == a.ID && slices.Contains(networks, o.network) }
		if _, err := releaseNAT(ctx, owned); err != nil {
			return fmt.Errorf("cni: delete %s: %w", a.ID, err)
		}
	}
	if len(cached) == 0 && fallback == nil {
		// Nothing to DEL with (no config ever loaded): what a crash
		// mid-ADD left stays recorded for GC to release.
		return nil
	}
	if err := m.owned.remove(a.ID); err != nil {
		return err
	}
	m.log.Debug("detached pod", "id", a.ID, "pod", a.PodNamespace+"/"+a.PodName)
	return nil
}

// delCached runs a DEL with the config and arguments cached at ADD, and
// returns the config it used.
func (m *Manager) delCached(ctx context.Context, c *libcni.NetworkAttachment, netns string, fallback *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	list, err := libcni.NetworkConfFromBytes(c.Config)
	if err != nil {
		if fallback == nil {
			return nil, fmt.Errorf("cni: delete %s: cached config: %w", c.ContainerID, err)
		}
		m.log.Warn("ignoring unreadable cached CNI config", "id", c.ContainerID, "err", err)
		list = fallback
	}
	if err := m.cni.DelNetworkList(ctx, list, cachedRuntimeConf(c, netns)); err != nil {
		return list, fmt.Errorf("cni: delete %s from network %q: %w", c.ContainerID, list.Name, whyKilled(ctx, err))
	}
	return list, nil
}

// whyKilled adds to the error of a plugin call that ctx ended why it did,
// which libcni leaves out ("signal: killed").
func whyKilled(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

// usesNAT reports whether the network has plugins that make iptables nat
// rules: portmap, or any with ipMasq (bridge, ptp).
func usesNAT(list *libcni.NetworkConfigList) bool {
	for _, p := range list.Plugins {
		var conf struct {
			IPMasq bool `json:"ipMasq"`
		}
		if p.Network.Type == "portmap" || json.Unmarshal(p.Bytes, &conf) == nil && conf.IPMasq {
			return true
		}
	}
	return false
}

// Attached reports whether libcni holds a cached ADD for the attachment,
// i.e. whether a DEL has anything to release.
func (m *Manager) Attached(a Attachment) bool {
	cached, err := m.cni.GetCachedAttachments(a.ID)
	return err == nil && len(cached) > 0
}

// Check asks the plugins whether the pod's attachment is still intact (CNI
// CHECK), with the config cached at its ADD. If they say no, it returns an
// error wrapping ErrCheckFailed only when it sees that the netns, or an
// interface or address of the ADD result, is gone; other failures are
// errors without it. It returns nil if there is nothing cached to check or
// the config's cniVersion predates CHECK (0.4.0).
func (m *Manager) Check(ctx context.Context, a Attachment) error {
	if a.ID == "" || a.NetNS == "" {
		return fmt.Errorf("cni: check %q: ID and NetNS are required", a.ID)
	}
	defer m.track(a.ID)()
	cached, err := m.cni.GetCachedAttachments(a.ID)
	if err != nil {
		return fmt.Errorf("cni: check %s: %w", a.ID, err)
	}
	if len(cached) == 0 {
		return nil
	}
	if netns, err := liveNetNS(a.NetNS); err != nil {
		return fmt.Errorf("cni: check %s: %w", a.ID, err)
	} else if netns == "" {
		return fmt.Errorf("cni: check %s: %w: netns %s is gone", a.ID, ErrCheckFailed, a.NetNS)
	}
	for _, c := range cached {
		list, err := libcni.NetworkConfFromBytes(c.Config)
		if err != nil {
			return fmt.Errorf("cni: check %s: cached config: %w", a.ID, err)
		}
		rt := cachedRuntimeConf(c, a.NetNS)
		checkCtx, cancel := context.WithTimeout(ctx, m.bounds.check)
		err = m.cni.CheckNetworkList(checkCtx, m.checkable(list, rt), rt)
		ended := checkCtx.Err()
		cancel()
		switch {
		case err == nil, errors.Is(err, libcni.ErrorCheckNotSupp):
		case ended != nil:
			// The plugin was killed, which says nothing about the pod.
			return fmt.Errorf("cni: check %s: %w", a.ID, ended)
		default:
			// A failed CHECK alone is no proof: plugins fail it for
			// reasons of their own (a custom config, a missing host
			// tool, a bug), and recreating the sandbox would restart
			// the pod at every check. What is seen to be gone is.
			if gone := m.missingParts(list, rt); gone != nil {
				return fmt.Errorf("cni: check %s in network %q: %w: %w (plugins: %w)", a.ID, list.Name, ErrCheckFailed, gone, err)
			}
			return fmt.Errorf("cni: check %s in network %q failed, its interfaces and addresses are in place: %w", a.ID, list.Name, err)
		}
	}
	return nil
}

// checkable returns list without the plugins whose CHECK fails for healthy
// attachments in the versions distributions ship (Debian 12: 1.1.1):
//   - portmap before v1.2.0 checks for its IPv6 chain even for a pod
//     without IPv6 whenever ip6tables works (containernetworking/plugins#819);
//   - bandwidth before v1.9.1 crashes for a pod without limits (#1221).
//
// Both check host-side rules; the pod's interface is bridge's to check.
func (m *Manager) checkable(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *libcni.NetworkConfigList {
	hasIPv6 := false
	if res, err := m.cni.GetNetworkListCachedResult(list, rt); err == nil && res != nil {
		if r, err := current.NewResultFromResult(res); err == nil {
			hasIPv6 = slices.ContainsFunc(r.IPs, func(ip *current.IPConfig) bool { return ip.Address.IP.To4() == nil })
		}
	}
	_, limited := rt.CapabilityArgs["bandwidth"]
	l := *list
	l.Plugins = slices.DeleteFunc(slices.Clone(list.Plugins), func(p *libcni.PluginConfig) bool {
		switch p.Network.Type {
		case "portmap":
			return !hasIPv6
		case "bandwidth":
			return !limited && !hasStaticLimits(p)
		}
		return false
	})
	return &l
}

// hasStaticLimits reports whether a bandwidth plugin's config sets limits
// itself rather than take them from the pod.
func hasStaticLimits(p *libcni.PluginConfig) bool {
	var conf map[string]json.RawMessage
	if json.Unmarshal(p.Bytes, &conf) != nil {
		return false
	}
	for _, k := range []string{"ingressRate", "ingressBurst", "egressRate", "egressBurst"} {
		if _, ok := conf[k]; ok {
			return true
		}
	}
	return false
}

// liveNetNS returns path if it holds a namespace and "" otherwise: plugins
// fail on a netns path that no longer holds one, while with none given they
// still release IPs and host-side state.
func liveNetNS(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	live, err := IsNamespace(path)
	if err != nil || !live {
		return "", err
	}
	return path, nil
}

func runtimeConf(a Attachment) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: a.ID,
		NetNS:       a.NetNS,
		IfName:      ifName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", a.PodNamespace},
			{"K8S_POD_NAME", a.PodName},
			{"K8S_POD_UID", a.PodUID},
			{"K8S_POD_INFRA_CONTAINER_ID", a.ID},
		},
		CapabilityArgs: map[string]any{},
	}
	// Capabilities only when set: a plugin given one applies it, e.g.
	// bandwidth would reject an empty limit.
	if len(a.PortMappings) > 0 {
		pms := make([]PortMapping, len(a.PortMappings))
		for i, pm := range a.PortMappings {
			pm.Protocol = strings.ToLower(pm.Protocol)
			if pm.Protocol == "" {
				pm.Protocol = "tcp"
			}
			pms[i] = pm
		}
		rt.CapabilityArgs["portMappings"] = pms
	}
	if a.Bandwidth != nil {
		rt.CapabilityArgs["bandwidth"] = a.Bandwidth
	}
	if a.DNS != nil {
		rt.CapabilityArgs["dns"] = a.DNS
	}
	return rt
}

// cachedRuntimeConf rebuilds the runtime config of a cached ADD.
func cachedRuntimeConf(c *libcni.NetworkAttachment, netns string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID:    c.ContainerID,
		NetNS:          netns,
		IfName:         c.IfName,
		Args:           c.CniArgs,
		CapabilityArgs: c.CapabilityArgs,
	}
}

// podIPs returns the result's addresses on interfaces inside the pod (or on
// no named interface), IPv4 first.
func podIPs(res types.Result) ([]string, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("parse result: %w", err)
	}
	var v4, v6 []string
	for _, ip := range r.IPs {
		if i := ip.Interface; i != nil && *i >= 0 && *i < len(r.Interfaces) && r.Interfaces[*i].Sandbox == "" {
			continue // a host-side address, e.g. on the bridge
		}
		if ip.Address.IP.To4() != nil {
			v4 = append(v4, ip.Address.IP.String())
		} else {
			v6 = append(v6, ip.Address.IP.String())
		}
	}
	if len(v4)+len(v6) == 0 {
		return nil, errors.New("result has no pod IP")
	}
	return append(v4, v6...), nil
}

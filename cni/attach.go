package cni

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

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
}

// PortMapping is a hostPort; the JSON names are the CNI portMappings
// capability's.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"` // tcp (default), udp or sctp
	HostIP        string `json:"hostIP,omitempty"`
}

// Add attaches the pod (CNI ADD) and returns its IPs, IPv4 first. If any part
// fails, what was allocated is released with a DEL before Add returns.
func (m *Manager) Add(ctx context.Context, a Attachment) (ips []string, retErr error) {
	if a.ID == "" || a.NetNS == "" {
		return nil, fmt.Errorf("cni: add %q: ID and NetNS are required", a.ID)
	}
	// Registered before the ADD, since ADD may allocate and then fail.
	defer func() {
		if retErr == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if err := m.Del(ctx, a); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("rollback: %w", err))
		}
	}()

	res, err := m.cni.AddNetworkList(ctx, m.list, runtimeConf(a))
	if err != nil {
		return nil, fmt.Errorf("cni: add %s to network %q: %w", a.ID, m.list.Name, err)
	}
	ips, err = podIPs(res)
	if err != nil {
		return nil, fmt.Errorf("cni: add %s to network %q: %w", a.ID, m.list.Name, err)
	}
	m.log.Debug("attached pod", "id", a.ID, "pod", a.PodNamespace+"/"+a.PodName, "ips", ips)
	return ips, nil
}

// Del detaches the pod (CNI DEL). It uses the config and arguments libcni
// cached at ADD when present, so the DEL matches the ADD even if the config
// file changed since. Repeating it, or calling it for a pod never attached or
// whose netns is gone, succeeds. Call it before RemoveNamespaces: without
// the pod's interface the bridge plugin releases the IP but cannot find its
// masquerade rules (a reboot clears those anyway).
func (m *Manager) Del(ctx context.Context, a Attachment) error {
	if a.ID == "" {
		return errors.New("cni: delete: ID is required")
	}
	rt := runtimeConf(a)
	if rt.NetNS != "" {
		// Plugins fail on a netns path that no longer holds a namespace;
		// with none given they still release IPs and host-side state.
		live, err := isNamespace(rt.NetNS)
		if err != nil {
			return fmt.Errorf("cni: delete %s: %w", a.ID, err)
		}
		if !live {
			rt.NetNS = ""
		}
	}

	list := m.list
	cached, cachedRt, err := m.cni.GetNetworkListCachedConfig(m.list, rt)
	if err == nil && cached != nil {
		list, err = libcni.NetworkConfFromBytes(cached)
		rt = cachedRt
	}
	if err != nil {
		// A broken cache must not block the release; the current config
		// is the best remaining guess.
		m.log.Warn("ignoring unreadable CNI cache", "id", a.ID, "err", err)
		list = m.list
	}

	if err := m.cni.DelNetworkList(ctx, list, rt); err != nil {
		return fmt.Errorf("cni: delete %s from network %q: %w", a.ID, list.Name, err)
	}
	m.log.Debug("detached pod", "id", a.ID, "pod", a.PodNamespace+"/"+a.PodName)
	return nil
}

// Attached reports whether libcni holds a cached ADD for the attachment,
// i.e. whether a DEL has anything to release.
func (m *Manager) Attached(a Attachment) bool {
	cached, _, err := m.cni.GetNetworkListCachedConfig(m.list, runtimeConf(a))
	return err == nil && cached != nil
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
	}
	if len(a.PortMappings) > 0 {
		pms := make([]PortMapping, len(a.PortMappings))
		for i, pm := range a.PortMappings {
			pm.Protocol = strings.ToLower(pm.Protocol)
			if pm.Protocol == "" {
				pm.Protocol = "tcp"
			}
			pms[i] = pm
		}
		rt.CapabilityArgs = map[string]any{"portMappings": pms}
	}
	return rt
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

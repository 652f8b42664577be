package cni

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// HostInterfaces names the attachment's host-side interfaces (its veth and
// the bridge it hangs on), read from libcni's cached ADD result. It returns
// nil when nothing is cached.
func (m *Manager) HostInterfaces(a Attachment) []string {
	cached, err := m.cni.GetCachedAttachments(a.ID)
	if err != nil {
		return nil
	}
	return m.hostInterfaces(cached)
}

func (m *Manager) hostInterfaces(cached []*libcni.NetworkAttachment) []string {
	var out []string
	for _, c := range cached {
		list, err := libcni.NetworkConfFromBytes(c.Config)
		if err != nil {
			continue
		}
		res, err := m.cni.GetNetworkListCachedResult(list, cachedRuntimeConf(c, ""))
		if err != nil || res == nil {
			continue
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			continue
		}
		for _, i := range r.Interfaces {
			if i.Sandbox == "" && i.Name != "" {
				out = append(out, i.Name)
			}
		}
	}
	return out
}

// WatchLinkDeletions calls gone with the name of every network interface
// removed from the host's namespace until ctx ends. It is how a pod whose
// veth was deleted underneath it is noticed at once, with no polling.
func WatchLinkDeletions(ctx context.Context, gone func(name string)) error {
	updates := make(chan netlink.LinkUpdate, 64)
	errs := make(chan error, 1)
	err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case errs <- err:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("cni: subscribe to link changes: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("cni: link updates: %w", err)
		case u, ok := <-updates:
			if !ok {
				return nil
			}
			if u.Header.Type == unix.RTM_DELLINK && u.Link != nil {
				gone(u.Link.Attrs().Name)
			}
		}
	}
}

// removeStrayVeths deletes the named host interfaces that are veths: the
// host ends of a pod whose netns is gone from its pin but still held open
// elsewhere, which a DEL without the netns cannot reach. Left on the
// bridge, such a veth keeps the old address's neighbour and traffic.
func removeStrayVeths(names []string) error {
	var errs []error
	for _, name := range names {
		l, err := netlink.LinkByName(name)
		if err != nil || l.Type() != "veth" {
			continue // gone with its netns, or the bridge
		}
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("cni: remove %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

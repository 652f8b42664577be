package cni

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// missingParts compares the attachment with its cached ADD result and
// returns an error naming what is gone: an interface in the pod's netns or
// on the host, or an address of the pod's. It returns nil when all is there,
// and when it cannot tell (nothing cached, a netlink error), since only what
// is seen to be gone proves a breakage.
func (m *Manager) missingParts(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	res, err := m.cni.GetNetworkListCachedResult(list, rt)
	if err != nil || res == nil {
		return nil
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil
	}
	ns, err := netns.GetFromPath(rt.NetNS)
	if err != nil {
		return nil
	}
	defer ns.Close()
	// Links and addresses need only the route socket (the default set
	// also opens xfrm and netfilter ones).
	pod, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil
	}
	defer pod.Close()

	var gone []string
	podLinks := map[int]netlink.Link{} // by index in r.Interfaces
	for i, iface := range r.Interfaces {
		var l netlink.Link
		if iface.Sandbox != "" {
			l, err = pod.LinkByName(iface.Name)
		} else {
			l, err = netlink.LinkByName(iface.Name)
		}
		var notFound netlink.LinkNotFoundError
		switch {
		case errors.As(err, &notFound):
			gone = append(gone, "interface "+iface.Name)
		case err == nil && iface.Sandbox != "":
			podLinks[i] = l
		}
	}
	for _, ip := range r.IPs {
		var links []netlink.Link
		if ip.Interface != nil {
			l, ok := podLinks[*ip.Interface]
			if !ok {
				continue // a host-side address, or its interface is gone
			}
			links = []netlink.Link{l}
		} else if links, err = pod.LinkList(); err != nil {
			continue
		}
		if found, err := hasAddr(pod, links, ip); err == nil && !found {
			gone = append(gone, "address "+ip.Address.IP.String())
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return fmt.Errorf("%s gone", strings.Join(gone, ", "))
}

// hasAddr reports whether one of links holds ip's address.
func hasAddr(h *netlink.Handle, links []netlink.Link, ip *current.IPConfig) (bool, error) {
	for _, l := range links {
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return false, err
		}
		for _, a := range addrs {
			if a.IP.Equal(ip.Address.IP) {
				return true, nil
			}
		}
	}
	return false, nil
}

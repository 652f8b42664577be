package cni

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestPodChain runs noderun's default config per pod: bridge alone for a
// plain pod (with "lo" up all the same), portmap added for hostPorts; DEL
// releases with the chain cached at ADD. A config that differs from the
// default by one byte is the user's and runs whole.
func TestPodChain(t *testing.T) {
	cfg, m := testManager(t)
	ctx := context.Background()

	plain := testPod(t, m, "plain")
	ips, err := m.Add(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cachedChain(t, m, plain.ID), []string{"bridge"}; !slices.Equal(got, want) {
		t.Errorf("plain pod's chain = %v, want %v", got, want)
	}
	if out := run(t, "nsenter", "--net="+plain.NetNS, "ip", "-o", "link", "show", "lo"); !strings.Contains(out, ",UP") {
		t.Errorf("lo is not up in the pod without the loopback plugin: %s", out)
	}

	ported := testPod(t, m, "ported")
	ported.PortMappings = []PortMapping{{HostPort: 45123, ContainerPort: 80}}
	if _, err := m.Add(ctx, ported); err != nil {
		t.Fatal(err)
	}
	if got, want := cachedChain(t, m, ported.ID), []string{"bridge", "portmap"}; !slices.Equal(got, want) {
		t.Errorf("hostPort pod's chain = %v, want %v", got, want)
	}

	for _, a := range []Attachment{plain, ported} {
		if err := m.Del(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(leaseFile(cfg, m.NetworkName(), ips[0])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("plain pod's lease not released (stat: %v)", err)
	}

	path := filepath.Join(cfg.ConfDir, defaultConfName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(data, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	user := testPod(t, m, "user")
	if _, err := m.Add(ctx, user); err != nil {
		t.Fatal(err)
	}
	if got, want := cachedChain(t, m, user.ID), []string{"bridge", "portmap", "bandwidth", "loopback"}; !slices.Equal(got, want) {
		t.Errorf("a user's config ran %v, want the whole %v", got, want)
	}
	if err := m.Del(ctx, user); err != nil {
		t.Fatal(err)
	}
}

// cachedChain returns the plugin types of the config libcni cached at id's ADD.
func cachedChain(t *testing.T, m *Manager, id string) []string {
	t.Helper()
	cached, err := m.cni.GetCachedAttachments(id)
	if err != nil || len(cached) != 1 {
		t.Fatalf("cached attachments of %s: %d, %v", id, len(cached), err)
	}
	list, err := libcni.NetworkConfFromBytes(cached[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	return types
}

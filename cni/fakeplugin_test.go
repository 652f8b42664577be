package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// fakeNetwork returns a Manager whose one plugin, nrt-record, is a shell
// script that records the stdin of every call under rec as
// <command>-<container id>.json, answers ADD with a fixed IP, fails CHECK
// while rec/fail exists and hangs in a command while rec/hang-<command>
// exists. Its config declares the capabilities in caps, and host-local IPAM
// with leases under dir/networks (which the script ignores). It needs
// neither root nor real plugins.
func fakeNetwork(t *testing.T, cniVersion string, caps ...string) (m *Manager, rec string) {
	t.Helper()
	dir := t.TempDir()
	rec, binDir, confDir := filepath.Join(dir, "rec"), filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	script := fmt.Sprintf(`#!/bin/sh
cat > %[1]s/$CNI_COMMAND-$CNI_CONTAINERID.json
if [ -e %[1]s/hang-$CNI_COMMAND ]; then exec sleep 600; fi
case $CNI_COMMAND in
ADD) echo '{"cniVersion":"%[2]s","ips":[{"version":"4","address":"10.99.0.2/24"}]}' ;;
CHECK) if [ -e %[1]s/fail ]; then echo '{"cniVersion":"%[2]s","code":100,"msg":"broken"}'; exit 1; fi ;;
esac
`, rec, cniVersion)
	writeFiles(t, rec, nil)
	writeFiles(t, binDir, map[string]string{"nrt-record": script})
	if err := os.Chmod(filepath.Join(binDir, "nrt-record"), 0o755); err != nil {
		t.Fatal(err)
	}
	capabilities := map[string]bool{}
	for _, c := range caps {
		capabilities[c] = true
	}
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": cniVersion, "name": "fake",
		"plugins": []any{map[string]any{"type": "nrt-record", "capabilities": capabilities,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(dir, "networks")}}},
	})
	writeFiles(t, confDir, map[string]string{"10-fake.conflist": string(conf)})
	m, err := New(Config{ConfDir: confDir, BinDirs: []string{binDir}, CacheDir: filepath.Join(dir, "cache"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ready(); err != nil {
		t.Fatal(err)
	}
	return m, rec
}

// recorded returns the stdin of a recorded plugin call, or nil if there was
// none.
func recorded(t *testing.T, rec, command, id string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rec, command+"-"+id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return conf
}

// fakeNetNS is a live netns path that needs no root: the test's own.
const fakeNetNS = "/proc/self/ns/net"

func TestCapabilityArgs(t *testing.T) {
	m, rec := fakeNetwork(t, "1.0.0", "portMappings", "bandwidth", "dns")
	tests := []struct {
		name string
		a    Attachment
		want string // runtimeConfig as JSON; "" for none
	}{
		{name: "none"},
		{
			name: "dns",
			a:    Attachment{DNS: &DNS{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.local"}, Options: []string{"ndots:5"}}},
			want: `{"dns":{"servers":["10.0.0.10"],"searches":["svc.local"],"options":["ndots:5"]}}`,
		},
		{
			name: "bandwidth",
			a:    Attachment{Bandwidth: &Bandwidth{IngressRate: 1e6, IngressBurst: 2147483647}},
			want: `{"bandwidth":{"ingressRate":1000000,"ingressBurst":2147483647}}`,
		},
		{
			name: "all",
			a: Attachment{
				PortMappings: []PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "UDP"}},
				Bandwidth:    &Bandwidth{EgressRate: 5e5, EgressBurst: 2147483647},
				DNS:          &DNS{Servers: []string{"1.1.1.1"}},
			},
			want: `{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"udp"}],
				"bandwidth":{"egressRate":500000,"egressBurst":2147483647},
				"dns":{"servers":["1.1.1.1"]}}`,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.a
			a.ID, a.NetNS = fmt.Sprintf("nrt-caps-%d", i), fakeNetNS
			if _, err := m.Add(context.Background(), a); err != nil {
				t.Fatal(err)
			}
			got := recorded(t, rec, "ADD", a.ID)["runtimeConfig"]
			var want any
			if tt.want != "" {
				if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
					t.Fatal(err)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("runtimeConfig = %v, want %v", got, want)
			}
			// DEL gets the same, from the cache.
			a.Bandwidth, a.DNS, a.PortMappings = nil, nil, nil
			if err := m.Del(context.Background(), a); err != nil {
				t.Fatal(err)
			}
			if got := recorded(t, rec, "DEL", a.ID)["runtimeConfig"]; !reflect.DeepEqual(got, want) {
				t.Errorf("DEL runtimeConfig = %v, want %v", got, want)
			}
		})
	}
}

func TestCheckFake(t *testing.T) {
	ctx := context.Background()
	t.Run("1.0.0", func(t *testing.T) {
		m, rec := fakeNetwork(t, "1.0.0")
		a := Attachment{ID: "nrt-check", NetNS: fakeNetNS}
		if err := m.Check(ctx, a); err != nil {
			t.Errorf("Check before Add: %v", err)
		}
		if recorded(t, rec, "CHECK", a.ID) != nil {
			t.Error("Check without a cached ADD ran the plugin")
		}
		if _, err := m.Add(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := m.Check(ctx, a); err != nil {
			t.Errorf("Check of a healthy attachment: %v", err)
		}
		if recorded(t, rec, "CHECK", a.ID)["prevResult"] == nil {
			t.Error("CHECK got no prevResult")
		}
		writeFiles(t, rec, map[string]string{"fail": ""})
		if err := m.Check(ctx, a); !errors.Is(err, ErrCheckFailed) {
			t.Errorf("Check with a failing plugin = %v, want ErrCheckFailed", err)
		}
		gone := a
		gone.NetNS = filepath.Join(t.TempDir(), "net")
		if err := m.Check(ctx, gone); !errors.Is(err, ErrCheckFailed) {
			t.Errorf("Check with the netns gone = %v, want ErrCheckFailed", err)
		}
	})
	t.Run("0.3.1 has no CHECK", func(t *testing.T) {
		m, rec := fakeNetwork(t, "0.3.1")
		a := Attachment{ID: "nrt-check-old", NetNS: fakeNetNS}
		if _, err := m.Add(ctx, a); err != nil {
			t.Fatal(err)
		}
		writeFiles(t, rec, map[string]string{"fail": ""})
		if err := m.Check(ctx, a); err != nil {
			t.Errorf("Check = %v, want nil", err)
		}
		if recorded(t, rec, "CHECK", a.ID) != nil {
			t.Error("CHECK ran for a 0.3.1 config")
		}
	})
}

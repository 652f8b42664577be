package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
)

// fakeCNI records the calls the sandbox makes and holds an attachment per
// sandbox ID, as the CNI cache in the state dir does across reboots.
type fakeCNI struct {
	mu       sync.Mutex
	notReady error    // Ready's answer
	addErr   error    // Add's failure
	checkErr error    // Check's answer
	ips      []string // what Add returns
	ifaces   []string // each attachment's host interfaces
	attached map[string]bool
	calls    []string // "add ID netns=PATH", "del ID netns=", "check ID"
}

func newFakeCNI() *fakeCNI {
	return &fakeCNI{ips: []string{"10.0.0.7"}, ifaces: []string{"veth7"}, attached: map[string]bool{}}
}

func (f *fakeCNI) Ready() error { return f.notReady }

func (f *fakeCNI) Attached(a cni.Attachment) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attached[a.ID]
}

func (f *fakeCNI) Add(_ context.Context, a cni.Attachment) ([]string, error) {
	f.record("add " + a.ID + " netns=" + a.NetNS)
	if f.addErr != nil {
		return nil, f.addErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached[a.ID] = true
	return f.ips, nil
}

func (f *fakeCNI) Del(_ context.Context, a cni.Attachment) error {
	f.record("del " + a.ID + " netns=" + a.NetNS)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.attached, a.ID)
	return nil
}

func (f *fakeCNI) Check(_ context.Context, a cni.Attachment) error {
	f.record("check " + a.ID)
	return f.checkErr
}

func (f *fakeCNI) GC(context.Context, map[string]bool) ([]string, error) { return nil, nil }

func (f *fakeCNI) HostInterfaces(cni.Attachment) []string { return f.ifaces }

func (f *fakeCNI) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

// took returns the calls made since the last took.
func (f *fakeCNI) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func wantCalls(t *testing.T, f *fakeCNI, want ...string) {
	t.Helper()
	if got := f.took(); !slices.Equal(got, want) {
		t.Errorf("CNI calls %q, want %q", got, want)
	}
}

// newSandbox is a pod sandbox in a fresh sandboxes dir, torn down (its
// namespaces and /dev/shm unmounted) when the test ends.
func newSandbox(t *testing.T, f *fakeCNI, hostNetwork bool) (*Pods, *runner.Sandbox) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pods")
	p := New(f, dir, nil)
	sb := &runner.Sandbox{ID: "sb1", PodName: "web", Namespace: "default", HostNetwork: hostNetwork, Dir: filepath.Join(dir, "sb1")}
	t.Cleanup(func() {
		if err := p.Teardown(context.Background(), sb); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return p, sb
}

// attachedSandbox is a sandbox set up (as root), with the calls that took
// forgotten.
func attachedSandbox(t *testing.T, f *fakeCNI) (*Pods, *runner.Sandbox) {
	t.Helper()
	requireRoot(t)
	p, sb := newSandbox(t, f, false)
	if _, _, err := p.Setup(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	f.took()
	return p, sb
}

func requireRoot(t *testing.T) {
	testenv.Require(t, os.Geteuid() == 0, "root (to make namespaces)")
}

// A new pod is attached once; its IPs are remembered in its sandbox dir.
func TestSetupAttachesANewPod(t *testing.T) {
	requireRoot(t)
	f := newFakeCNI()
	p, sb := newSandbox(t, f, false)
	ips, fresh, err := p.Setup(context.Background(), sb)
	if err != nil {
		t.Fatal(err)
	}
	if !fresh || !slices.Equal(ips, f.ips) {
		t.Errorf("Setup = %v, fresh %v; want %v, fresh", ips, fresh, f.ips)
	}
	wantCalls(t, f, "add sb1 netns="+sb.NetNSPath())
	if !isNamespace(sb.NetNSPath()) {
		t.Errorf("%s is not a pinned network namespace", sb.NetNSPath())
	}
	if got, err := readIPs(sb.Dir); err != nil || !slices.Equal(got, f.ips) {
		t.Errorf("remembered IPs %v (%v), want %v", got, err, f.ips)
	}
}

// A restarted noderun finds the live sandbox and its IPs: no CNI call, not
// fresh (its containers still run in it), and its interfaces are followed.
func TestSetupAdoptsALiveSandboxAfterARestart(t *testing.T) {
	f := newFakeCNI()
	p, sb := attachedSandbox(t, f)
	restarted := New(f, p.dir, nil)
	ips, fresh, err := restarted.Setup(context.Background(), sb)
	if err != nil {
		t.Fatal(err)
	}
	if fresh || !slices.Equal(ips, f.ips) {
		t.Errorf("Setup after a restart = %v, fresh %v; want %v, not fresh", ips, fresh, f.ips)
	}
	wantCalls(t, f)
	var poked []string
	restarted.interfaceDeleted(f.ifaces[0], func(id string) { poked = append(poked, id) })
	if !slices.Equal(poked, []string{"sb1"}) {
		t.Errorf("deleting the adopted pod's veth poked %v, want [sb1]", poked)
	}
}

// After a reboot the sandbox dir is gone but CNI still holds the pod's
// attachment: it is released (by ID: its netns is gone) before the new one.
func TestSetupReleasesAStaleAttachmentAfterAReboot(t *testing.T) {
	requireRoot(t)
	f := newFakeCNI()
	p, sb := newSandbox(t, f, false)
	f.attached["sb1"] = true
	_, fresh, err := p.Setup(context.Background(), sb)
	if err != nil {
		t.Fatal(err)
	}
	if !fresh {
		t.Error("a sandbox made after a reboot is not fresh")
	}
	wantCalls(t, f, "del sb1 netns=", "add sb1 netns="+sb.NetNSPath())
}

// A deleted host interface makes the pod's next cheap Check ask the
// plugins; a failed CHECK reports the sandbox broken, and its teardown
// releases the attachment by ID, since the plugins cannot find it through
// the netns.
func TestDeletedInterfaceMakesTheSandboxBroken(t *testing.T) {
	ctx := context.Background()
	f := newFakeCNI()
	p, sb := attachedSandbox(t, f)
	if err := p.Check(ctx, sb, false); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f) // nothing suspect: no CHECK
	var poked []string
	p.interfaceDeleted("eth9", func(id string) { poked = append(poked, id) })
	p.interfaceDeleted(f.ifaces[0], func(id string) { poked = append(poked, id) })
	if !slices.Equal(poked, []string{"sb1"}) {
		t.Errorf("poked %v, want [sb1] (only the pod using the deleted veth)", poked)
	}
	f.checkErr = fmt.Errorf("%w: no veth", cni.ErrCheckFailed)
	if err := p.Check(ctx, sb, false); !errors.Is(err, runner.ErrSandboxBroken) {
		t.Errorf("Check of a suspect sandbox = %v, want ErrSandboxBroken", err)
	}
	wantCalls(t, f, "check sb1")
	if err := p.Teardown(ctx, sb); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f, "del sb1 netns=")
	poked = nil
	p.interfaceDeleted(f.ifaces[0], func(id string) { poked = append(poked, id) })
	if len(poked) > 0 {
		t.Errorf("a torn-down pod was poked: %v", poked)
	}
}

// Deeply, a healthy sandbox is checked by the plugins; its teardown
// releases the attachment through its netns.
func TestDeepCheckAndTeardownOfAHealthySandbox(t *testing.T) {
	ctx := context.Background()
	f := newFakeCNI()
	p, sb := attachedSandbox(t, f)
	if err := p.Check(ctx, sb, true); err != nil {
		t.Fatal(err)
	}
	if err := p.Teardown(ctx, sb); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f, "check sb1", "del sb1 netns="+sb.NetNSPath())
	if _, err := os.Stat(sb.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir after teardown: %v", err)
	}
}

// A sandbox whose netns vanished is broken without asking the plugins.
func TestCheckWithoutNetNSIsBroken(t *testing.T) {
	f := newFakeCNI()
	p := New(f, t.TempDir(), nil)
	sb := &runner.Sandbox{ID: "sb1", Dir: filepath.Join(p.dir, "sb1")}
	if err := p.Check(context.Background(), sb, true); !errors.Is(err, runner.ErrSandboxBroken) {
		t.Errorf("Check = %v, want ErrSandboxBroken", err)
	}
	wantCalls(t, f)
}

// An unusable network configuration is reported as runner's
// ErrNetworkNotReady, before anything is made.
func TestSetupWaitsForAUsableNetwork(t *testing.T) {
	f := newFakeCNI()
	f.notReady = fmt.Errorf("%w: no config", cni.ErrNetworkNotReady)
	p := New(f, t.TempDir(), nil)
	sb := &runner.Sandbox{ID: "sb1", Dir: filepath.Join(p.dir, "sb1")}
	if _, _, err := p.Setup(context.Background(), sb); !errors.Is(err, runner.ErrNetworkNotReady) {
		t.Errorf("Setup = %v, want ErrNetworkNotReady", err)
	}
	wantCalls(t, f)
	if _, err := os.Stat(sb.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir made while the network is not ready: %v", err)
	}
}

// A hostNetwork pod never meets CNI; its sandbox is fresh only the first
// time.
func TestHostNetworkSandboxSkipsCNI(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	f := newFakeCNI()
	p, sb := newSandbox(t, f, true)
	for i, wantFresh := range []bool{true, false} {
		ips, fresh, err := p.Setup(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		if ips != nil || fresh != wantFresh {
			t.Errorf("Setup #%d = %v, fresh %v; want no IPs, fresh %v", i+1, ips, fresh, wantFresh)
		}
	}
	if err := p.Teardown(ctx, sb); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f)
}

// A change in a CNI conf or bin dir pokes every pod (sandbox ID "").
func TestConfigChangePokesEveryPod(t *testing.T) {
	dir := t.TempDir()
	p := New(newFakeCNI(), t.TempDir(), nil, WithConfigDirs(dir))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	poked := make(chan string, 1)
	go p.watchConfig(ctx, func(id string) {
		select {
		case poked <- id:
		default:
		}
	})
	// Written until seen: the watch may not be in place at the first write.
	deadline := time.After(30 * time.Second)
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(dir, "10-net.conflist"), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-poked:
			if id != "" {
				t.Errorf("poked %q, want every pod (\"\")", id)
			}
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("a config change poked nothing")
		}
	}
}

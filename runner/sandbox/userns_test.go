package sandbox

import (
	"context"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
	"github.com/noderun/noderun/runner"
)

// A user-namespaced pod's sandbox is made in its user namespace and
// adopted as it is after a restart; a version of the pod without one (the
// same UID) gets namespaces anew and attached again, and back.
func TestSetupUserNamespace(t *testing.T) {
	requireRoot(t)
	f := newFakeCNI()
	p, sb := newSandbox(t, f, false)
	sb.UserNS = &runner.IDMapping{HostID: 5 * 65536, Length: 65536}
	if _, fresh, err := p.Setup(context.Background(), sb); err != nil || !fresh {
		t.Fatalf("Setup: fresh %v, %v", fresh, err)
	}
	wantCalls(t, f, "add sb1 netns="+sb.NetNSPath())
	user := nsInode(t, sb.UserNSPath())
	if owner := testenv.UserNSOwner(t, sb.NetNSPath()); owner != user {
		t.Errorf("the pod's netns is owned by user namespace %d, not the pod's %d", owner, user)
	}
	if _, fresh, err := New(f, p.dir, nil).Setup(context.Background(), sb); err != nil || fresh {
		t.Errorf("Setup after a restart: fresh %v, %v; want the live sandbox adopted", fresh, err)
	}
	wantCalls(t, f)

	sb.UserNS = nil
	if _, fresh, err := p.Setup(context.Background(), sb); err != nil || !fresh {
		t.Fatalf("Setup without a user namespace: fresh %v, %v; want made anew", fresh, err)
	}
	if isNamespace(sb.UserNSPath()) || testenv.UserNSOwner(t, sb.NetNSPath()) != nsInode(t, "/proc/self/ns/user") {
		t.Error("the pod without hostUsers: false kept namespaces of its earlier user namespace")
	}
	if calls := f.took(); !slices.Contains(calls, "add sb1 netns="+sb.NetNSPath()) {
		t.Errorf("CNI calls %q: not attached again", calls)
	}
	sb.UserNS = &runner.IDMapping{HostID: 5 * 65536, Length: 65536}
	if _, fresh, err := p.Setup(context.Background(), sb); err != nil || !fresh || testenv.UserNSOwner(t, sb.NetNSPath()) != nsInode(t, sb.UserNSPath()) {
		t.Errorf("Setup with hostUsers: false again: fresh %v, %v; want made anew in a user namespace", fresh, err)
	}
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

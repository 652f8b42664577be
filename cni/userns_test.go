package cni

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
)

func TestCreateNamespacesInUserNS(t *testing.T) { eachLayout(t, testCreateNamespacesInUserNS) }

// testCreateNamespacesInUserNS checks that the pod's user namespace has its
// mapping, owns the pod's other namespaces, and is kept when all are
// pinned but made anew when one was lost.
func testCreateNamespacesInUserNS(t *testing.T, h *Holder) {
	dir := filepath.Join(t.TempDir(), "pod")
	m := IDMap{HostID: 7 * 65536, Size: 65536}
	nss, err := CreateNamespacesInUserNS(dir, "web-0", m, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, h) })
	held := heldDir(h, dir)
	if want := (Namespaces{User: dir + "/user", Net: dir + "/net", IPC: held + "/ipc", UTS: held + "/uts"}); nss != want {
		t.Fatalf("got %+v, want %+v", nss, want)
	}
	out, err := exec.Command("nsenter", "--user="+nss.User, "cat", "/proc/self/uid_map").CombinedOutput()
	if got := strings.Fields(string(out)); err != nil || strings.Join(got, " ") != "0 458752 65536" {
		t.Fatalf("uid_map in the pod's user namespace: %q, %v; want 0 458752 65536", out, err)
	}
	user := inode(t, nss.User)
	for _, p := range []string{nss.Net, nss.IPC, nss.UTS} {
		if owner := testenv.UserNSOwner(t, p); owner != user {
			t.Errorf("%s is owned by user namespace %d, not the pod's %d", p, owner, user)
		}
	}
	if got := inNamespace(t, nss.UTS, unix.CLONE_NEWUTS, func() (string, error) {
		return os.Hostname()
	}); got != "web-0" {
		t.Errorf("hostname %q, want web-0", got)
	}

	if _, err := CreateNamespacesInUserNS(dir, "web-0", m, h); err != nil {
		t.Fatal(err)
	}
	if inode(t, nss.User) != user {
		t.Error("a repeat with every namespace pinned made a new user namespace")
	}
	if err := unpin(nss.Net); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateNamespacesInUserNS(dir, "web-0", m, h); err != nil {
		t.Fatal(err)
	}
	if now := inode(t, nss.User); now == user || testenv.UserNSOwner(t, nss.Net) != now || testenv.UserNSOwner(t, nss.IPC) != now {
		t.Error("after the net pin was lost, the namespaces were not all made anew in one user namespace")
	}
}

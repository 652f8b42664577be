package runner

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// Ranges are disjoint, kept in the kubelet's file, read back after a
// restart, and free again once released.
func TestUsernsRanges(t *testing.T) {
	root := t.TempDir()
	dir := func(uid string) string { return filepath.Join(root, uid) }
	r := newUsernsRanges()
	seen := map[uint32]types.UID{}
	for _, uid := range []types.UID{"a", "b", "c"} {
		m, err := r.forPod(uid, dir(string(uid)))
		if err != nil {
			t.Fatal(err)
		}
		if m.Length != 65536 || m.HostID < 65536 || m.HostID%65536 != 0 {
			t.Fatalf("%s: %+v, want 65536 IDs from a multiple of 65536", uid, m)
		}
		if other, ok := seen[m.HostID]; ok {
			t.Fatalf("%s and %s share %d", uid, other, m.HostID)
		}
		seen[m.HostID] = uid
		if again, err := r.forPod(uid, dir(string(uid))); err != nil || again != m {
			t.Fatalf("%s again: %+v, %v; want %+v", uid, again, err, m)
		}
	}
	a := *r.kept("a")
	b, _ := os.ReadFile(filepath.Join(dir("a"), "userns"))
	if want := `{"uidMappings":[{"hostId":` + itoa(a.HostID) + `,"containerId":0,"length":65536}],"gidMappings":[{"hostId":` + itoa(a.HostID) + `,"containerId":0,"length":65536}]}`; string(b) != want {
		t.Errorf("userns file %s, want the kubelet's %s", b, want)
	}

	restarted := newUsernsRanges()
	for _, uid := range []types.UID{"a", "b", "c"} {
		if err := restarted.load(uid, dir(string(uid))); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := restarted.forPod("a", dir("a")); err != nil || m != a {
		t.Errorf("after a restart a has %+v, %v; want %+v", m, err, a)
	}
	if err := restarted.recordLocked("d", a); err == nil || !strings.Contains(err.Error(), "already taken") {
		t.Errorf("a second pod took a's range: %v", err)
	}
	restarted.release("a")
	if err := restarted.recordLocked("d", a); err != nil {
		t.Errorf("a's range not free after its release: %v", err)
	}
}

func TestUsernsFileChecks(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"two mappings", `{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536},{"hostId":131072,"containerId":65536,"length":65536}],"gidMappings":[]}`, "no more than one mapping"},
		{"gid differs", `{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}`, "should be identical"},
		{"root unmapped", `{"uidMappings":[{"hostId":65536,"containerId":1,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":1,"length":65536}]}`, "UID 0 must be mapped"},
		{"offset", `{"uidMappings":[{"hostId":65537,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65537,"containerId":0,"length":65536}]}`, "wrong user namespace offset"},
		{"host range", `{"uidMappings":[{"hostId":0,"containerId":0,"length":65536}],"gidMappings":[{"hostId":0,"containerId":0,"length":65536}]}`, "out of range"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "userns"), []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := newUsernsRanges().load("p", dir); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/noderun/noderun/internal/atomicfile"
)

// Pod user namespaces (hostUsers: false) as the kubelet's userns manager
// gives them: each pod one range of usernsLength host IDs, for UIDs and
// GIDs alike, starting at a multiple of usernsLength at or above 65536 (the
// kubelet's default when no "kubelet" user is in /etc/subuid: host IDs
// 65536 to 2^32), a free one picked at random. The range is kept in the
// pod's state dir, in the kubelet's file format, so that a restart gives a
// running pod the same range, and it is free again once the pod's dir is
// removed.
const (
	usernsLength  = 65536
	usernsFirst   = 1 << 16
	usernsSlots   = (1<<32 - usernsFirst) / usernsLength
	usernsFile    = "userns"
	usernsNoSlots = "could not find an empty slot to allocate a user namespace"
)

// UserNSUnsupported is the kubelet's refusal of a pod with hostUsers:
// false when the runtime cannot give it a user namespace.
const UserNSUnsupported = "can't set `spec.hostUsers: false`, runtime does not support user namespaces"

// IDMapping maps a pod's user namespace IDs 0..Length-1 onto the host's
// HostID..HostID+Length-1, UIDs and GIDs alike.
type IDMapping struct{ HostID, Length uint32 }

// usernsFileData is the kubelet's userns file.
type usernsFileData struct {
	UIDMappings []usernsFileMapping `json:"uidMappings"`
	GIDMappings []usernsFileMapping `json:"gidMappings"`
}

type usernsFileMapping struct {
	HostID      uint32 `json:"hostId"`
	ContainerID uint32 `json:"containerId"`
	Length      uint32 `json:"length"`
}

// usernsRanges records which pod holds which range; a nil one (unit
// tests' workers) holds none.
type usernsRanges struct {
	mu    sync.Mutex
	slots map[uint32]types.UID // slot (HostID/usernsLength - 1) -> pod
	pods  map[types.UID]uint32
}

func newUsernsRanges() *usernsRanges {
	return &usernsRanges{slots: map[uint32]types.UID{}, pods: map[types.UID]uint32{}}
}

// hostUsersFalse reports whether the pod asks for a user namespace.
func hostUsersFalse(pod *v1.Pod) bool {
	return pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers
}

// load records the range kept in a pod's state dir, if it has one: at
// start, for every pod dir, as the kubelet reads them before it runs pods.
func (r *usernsRanges) load(uid types.UID, podDir string) error {
	m, ok, err := readUsernsFile(podDir)
	if err != nil || !ok {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recordLocked(uid, m)
}

// forPod returns the pod's range: the one kept in its state dir, else a
// free one, which is kept there before it is returned.
func (r *usernsRanges) forPod(uid types.UID, podDir string) (IDMapping, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok, err := readUsernsFile(podDir)
	if err != nil {
		return IDMapping{}, fmt.Errorf("user namespace: %w", err)
	}
	if ok {
		return m, r.recordLocked(uid, m)
	}
	if slot, ok := r.pods[uid]; ok { // the file was lost: keep the range
		m = IDMapping{HostID: (slot + 1) * usernsLength, Length: usernsLength}
	} else if m, err = r.pickLocked(uid); err != nil {
		return IDMapping{}, fmt.Errorf("create user namespace: %w", err)
	}
	if err := writeUsernsFile(podDir, m); err != nil {
		r.releaseLocked(uid)
		return IDMapping{}, fmt.Errorf("create user namespace: %w", err)
	}
	return m, nil
}

// kept returns the pod's range if it has one.
func (r *usernsRanges) kept(uid types.UID) *IDMapping {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	slot, ok := r.pods[uid]
	if !ok {
		return nil
	}
	return &IDMapping{HostID: (slot + 1) * usernsLength, Length: usernsLength}
}

// pickLocked takes a free slot, starting the search at a random one as
// the kubelet's allocator does.
func (r *usernsRanges) pickLocked(uid types.UID) (IDMapping, error) {
	if len(r.slots) >= usernsSlots {
		return IDMapping{}, errors.New(usernsNoSlots)
	}
	start := rand.Uint32N(usernsSlots)
	for i := range uint32(usernsSlots) {
		slot := (start + i) % usernsSlots
		if _, used := r.slots[slot]; !used {
			r.slots[slot], r.pods[uid] = uid, slot
			return IDMapping{HostID: (slot + 1) * usernsLength, Length: usernsLength}, nil
		}
	}
	return IDMapping{}, errors.New(usernsNoSlots)
}

// recordLocked records a kept range, with the kubelet's checks.
func (r *usernsRanges) recordLocked(uid types.UID, m IDMapping) error {
	if m.Length != usernsLength {
		return fmt.Errorf("wrong user namespace length %v", m.Length)
	}
	if m.HostID%usernsLength != 0 {
		return fmt.Errorf("wrong user namespace offset specified %v", m.HostID)
	}
	if m.HostID < usernsFirst {
		return fmt.Errorf("id %v is out of range", m.HostID)
	}
	slot := m.HostID/usernsLength - 1
	if prev, ok := r.pods[uid]; ok {
		if prev != slot {
			return fmt.Errorf("different user namespace range already used by pod %q", uid)
		}
		return nil
	}
	if _, used := r.slots[slot]; used {
		return fmt.Errorf("range picked for pod %q already taken", uid)
	}
	r.slots[slot], r.pods[uid] = uid, slot
	return nil
}

// release frees the pod's range; its state dir, file and all, is gone or
// going.
func (r *usernsRanges) release(uid types.UID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseLocked(uid)
}

func (r *usernsRanges) releaseLocked(uid types.UID) {
	if slot, ok := r.pods[uid]; ok {
		delete(r.slots, slot)
		delete(r.pods, uid)
	}
}

// readUsernsFile reads the pod's kept range, with the kubelet's checks of
// the file (one mapping, the same for UIDs and GIDs, starting at ID 0).
func readUsernsFile(podDir string) (IDMapping, bool, error) {
	b, err := os.ReadFile(filepath.Join(podDir, usernsFile))
	if errors.Is(err, os.ErrNotExist) || err == nil && len(b) == 0 {
		return IDMapping{}, false, nil
	}
	if err != nil {
		return IDMapping{}, false, err
	}
	var f usernsFileData
	if err := json.Unmarshal(b, &f); err != nil {
		return IDMapping{}, false, fmt.Errorf("invalid user namespace mappings file: %w", err)
	}
	switch {
	case len(f.UIDMappings) != 1:
		return IDMapping{}, false, errors.New("invalid user namespace configuration: no more than one mapping allowed.")
	case len(f.GIDMappings) != 1 || f.UIDMappings[0] != f.GIDMappings[0]:
		return IDMapping{}, false, errors.New("invalid user namespace configuration: GID and UID mapping should be identical")
	case f.UIDMappings[0].ContainerID != 0:
		return IDMapping{}, false, errors.New("invalid user namespace configuration: UID 0 must be mapped")
	}
	return IDMapping{HostID: f.UIDMappings[0].HostID, Length: f.UIDMappings[0].Length}, true, nil
}

func writeUsernsFile(podDir string, m IDMapping) error {
	one := []usernsFileMapping{{HostID: m.HostID, ContainerID: 0, Length: m.Length}}
	b, _ := json.Marshal(usernsFileData{UIDMappings: one, GIDMappings: one}) // plain structs always marshal
	if err := os.MkdirAll(podDir, 0o750); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(podDir, usernsFile), b, 0o600)
}

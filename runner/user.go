package runner

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// processUser decides who a container runs as, as the kubelet does before
// it calls CRI: runAsUser/runAsGroup (container over pod), else the image's
// user with its ":group" part dropped (kubelet passes only the user on, see
// kubernetes#61967), else root. runAsNonRoot is checked here, before any
// container exists.
func processUser(pod *v1.Pod, c *v1.Container, img ImageConfig) (ProcessUser, error) {
	runAsUser, runAsGroup, nonRoot := runAs(pod, c)
	uid, name := imageUser(img.User)
	if nonRoot {
		if err := verifyRunAsNonRoot(pod, c, runAsUser, uid, name); err != nil {
			return ProcessUser{}, err
		}
	}
	u := ProcessUser{Group: runAsGroup}
	switch {
	case runAsUser != nil:
		u.User = strconv.FormatInt(*runAsUser, 10)
	case name != "":
		u.User = name
	default:
		u.User = strconv.FormatInt(*uid, 10)
	}
	psc := pod.Spec.SecurityContext
	if psc == nil {
		return u, nil
	}
	if psc.FSGroup != nil {
		u.Groups = append(u.Groups, *psc.FSGroup)
	}
	u.Groups = append(u.Groups, psc.SupplementalGroups...)
	switch p := psc.SupplementalGroupsPolicy; {
	case p == nil || *p == v1.SupplementalGroupsPolicyMerge:
	case *p == v1.SupplementalGroupsPolicyStrict:
		u.Strict = true
	default:
		return ProcessUser{}, fmt.Errorf("unsupported supplementalGroupsPolicy: %s", *p)
	}
	return u, nil
}

// runAs merges the pod's and the container's run-as settings, the
// container's winning (Kubernetes' DetermineEffectiveSecurityContext).
func runAs(pod *v1.Pod, c *v1.Container) (user, group *int64, nonRoot bool) {
	var nr *bool
	if p := pod.Spec.SecurityContext; p != nil {
		user, group, nr = p.RunAsUser, p.RunAsGroup, p.RunAsNonRoot
	}
	if s := c.SecurityContext; s != nil {
		user, group, nr = firstSet(s.RunAsUser, user), firstSet(s.RunAsGroup, group), firstSet(s.RunAsNonRoot, nr)
	}
	return user, group, nr != nil && *nr
}

func firstSet[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// imageUser reads the image's USER as containerd's CRI reports it to the
// kubelet: the part before ":", a uid if numeric, else a name; no user is
// root.
func imageUser(user string) (uid *int64, name string) {
	user, _, _ = strings.Cut(user, ":")
	if user == "" {
		return new(int64), ""
	}
	id, err := strconv.ParseInt(user, 10, 64)
	if err != nil {
		return nil, user
	}
	return &id, ""
}

// verifyRunAsNonRoot refuses what the kubelet refuses, with its messages.
func verifyRunAsNonRoot(pod *v1.Pod, c *v1.Container, runAsUser, uid *int64, name string) error {
	ref := fmt.Sprintf("(pod: %q, container: %s)", kubeletPodRef(pod), c.Name)
	switch {
	case runAsUser != nil && *runAsUser == 0:
		return fmt.Errorf("container's runAsUser breaks non-root policy %s", ref)
	case runAsUser != nil:
		return nil
	case uid == nil:
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root %s", name, ref)
	case *uid == 0:
		return fmt.Errorf("container has runAsNonRoot and image will run as root %s", ref)
	}
	if errs := validation.IsValidUserID(*uid); len(errs) > 0 {
		return fmt.Errorf("container has runAsNonRoot and image has an invalid user id (%d). (Must be 1-(%d)): %s %s",
			*uid, math.MaxInt32, strings.Join(errs, "; "), ref)
	}
	return nil
}

// kubeletPodRef formats a pod as the kubelet's messages do: name_namespace(uid).
func kubeletPodRef(pod *v1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}

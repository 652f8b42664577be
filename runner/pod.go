package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// QOSClass computes a pod's QoS class from its requests and limits, as the
// kubelet v1.37's ComputePodQOS: from the pod-level ones alone when it has
// any (spec.resources, PodLevelResources), else from its containers'.
func QOSClass(pod *v1.Pod) v1.PodQOSClass {
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		return podLevelQOS(pod.Spec.Resources)
	}
	guaranteed, any := true, false
	for _, c := range allContainers(pod) {
		for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
			// A zero quantity counts as none, as in the kubelet's GetPodQOS.
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			hasReq, hasLim = hasReq && req.Sign() > 0, hasLim && lim.Sign() > 0
			if hasReq || hasLim {
				any = true
			}
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !any:
		return v1.PodQOSBestEffort
	case guaranteed:
		return v1.PodQOSGuaranteed
	}
	return v1.PodQOSBurstable
}

// podLevelQOS is the kubelet's requirementsQOS for pod-level resources:
// BestEffort without cpu and memory, Guaranteed when both have a request
// equal to a non-zero limit (static pods get no pod-level defaulting, so a
// limit alone is Burstable), else Burstable.
func podLevelQOS(r *v1.ResourceRequirements) v1.PodQOSClass {
	var classes []v1.PodQOSClass
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		req, lim := r.Requests[name], r.Limits[name]
		switch {
		case !req.Equal(lim):
			return v1.PodQOSBurstable
		case req.IsZero():
			classes = append(classes, v1.PodQOSBestEffort)
		default:
			classes = append(classes, v1.PodQOSGuaranteed)
		}
	}
	if classes[0] != classes[1] {
		return v1.PodQOSBurstable
	}
	return classes[0]
}

func allContainers(pod *v1.Pod) []*v1.Container {
	out := make([]*v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// ContainerID derives a containerd id unique per pod, container and restart
// that fits containerd's 76-character identifier limit.
func ContainerID(podUID, name string, restart int) string {
	id := fmt.Sprintf("%s-%s-%d", shortHash(podUID, 12), name, restart)
	if len(id) > 76 {
		id = fmt.Sprintf("%s-%s-%d", shortHash(podUID, 12), shortHash(name, 16), restart)
	}
	return id
}

// SandboxID is the pod's stable sandbox id, CNI's container id.
func SandboxID(podUID string) string { return shortHash(podUID, 32) }

// SandboxesDir holds the sandbox dirs under the run dir.
func SandboxesDir(runDir string) string { return filepath.Join(runDir, "pods") }

// SandboxDir is the pod's sandbox dir (Sandbox.Dir): its pinned namespaces,
// /dev/shm, epoch and pod files, on the run dir so a reboot empties it.
func SandboxDir(runDir, podUID string) string {
	return filepath.Join(SandboxesDir(runDir), SandboxID(podUID))
}

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

// specHash fingerprints a container spec so a changed spec is noticed.
func specHash(c *v1.Container) string {
	b, _ := json.Marshal(c) // a v1.Container always marshals
	return shortHash(string(b), 16)
}

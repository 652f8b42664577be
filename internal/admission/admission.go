// Package admission is the kubelet's pod admission as a pure decision:
// whether a pod may start on this node beside the pods already admitted,
// and when not, the reason and message the kubelet writes. It follows the
// kubelet's predicate admit handler (pkg/kubelet/lifecycle/predicate.go and
// the scheduler plugins it calls: noderesources, nodeaffinity, nodeports)
// and its --node-labels flag. It runs nothing; runner decides
// with it, main reads the flag with it and `noderun check` warns with it.
package admission

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Result is an admission decision: an empty Reason admits the pod.
type Result struct {
	Reason  string // the pod's status.reason, the event's reason
	Message string // the event's message
}

// Admitted says whether the pod may run.
func (r Result) Admitted() bool { return r.Reason == "" }

// StatusMessage is the rejected pod's status.message, as the kubelet's
// rejectPod writes it.
func (r Result) StatusMessage() string { return "Pod was rejected: " + r.Message }

// The kubelet's reasons (pkg/kubelet/lifecycle/predicate.go) and the
// scheduler plugins' names and reasons it reports.
const (
	reasonOSSelector   = "PodOSSelectorNodeLabelDoesNotMatch"
	reasonOSField      = "PodOSNotSupported"
	ReasonSysctl       = "SysctlForbidden"
	insufficientPrefix = "OutOf"
	nodeAffinityName   = "NodeAffinity"
	nodeAffinityReason = "node(s) didn't match Pod's node affinity/selector"
	nodePortsName      = "NodePorts"
	nodePortsReason    = "node(s) didn't have free ports for the requested pod ports"
	osSelectorMessage  = "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
	osFieldMessage     = "Failed to admit pod as the OS field doesn't match node OS"
)

// Pod decides whether pod may start on node beside others, the pods
// admitted before it that are not finished. node needs its name, labels
// and status.allocatable (nil: resources are not checked). The checks and
// their order are the kubelet's; the first failure is the one reported.
// One of its checks cannot fail here and is left out: a static pod's
// nodeName is always this node's (the kubelet sets it, as
// manifests.Identify does).
func Pod(pod *v1.Pod, others []*v1.Pod, node *v1.Node) Result {
	// The kubelet compares with its own OS whatever the node's label says.
	if want, ok := pod.Labels[v1.LabelOSStable]; ok && want != runtime.GOOS {
		return Result{reasonOSSelector, osSelectorMessage}
	}
	if pod.Spec.OS != nil && string(pod.Spec.OS.Name) != runtime.GOOS {
		return Result{reasonOSField, osFieldMessage}
	}
	if node.Status.Allocatable != nil {
		if r := fits(withoutMissingExtended(pod, node), others, node); !r.Admitted() {
			return r
		}
	}
	if ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); !ok {
		return predicateFailed(nodeAffinityName, nodeAffinityReason)
	}
	if portsConflict(pod, others) {
		return predicateFailed(nodePortsName, nodePortsReason)
	}
	return Result{}
}

// MatchesNode reports whether the pod's nodeSelector and required node
// affinity match a node with these labels and name: what `noderun check`
// can tell from a manifest alone.
func MatchesNode(pod *v1.Pod, name string, labels map[string]string) bool {
	node := &v1.Node{}
	node.Name, node.Labels = name, labels
	ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
	return ok
}

func predicateFailed(name, desc string) Result {
	return Result{name, fmt.Sprintf("Predicate %s failed: %s", name, desc)}
}

// withoutMissingExtended drops the requests of extended resources the node
// does not have, as the kubelet does before it checks the fit: a static
// pod asking for a device no plugin registered is admitted (the kubelet's
// own comment calls this a caveat), and runs without the device.
func withoutMissingExtended(pod *v1.Pod, node *v1.Node) *v1.Pod {
	out := pod.DeepCopy()
	for _, cs := range [][]v1.Container{out.Spec.InitContainers, out.Spec.Containers} {
		for i := range cs {
			kept := v1.ResourceList{}
			for name, q := range cs[i].Resources.Requests {
				if _, has := node.Status.Allocatable[name]; IsExtendedResource(name) && !has {
					continue
				}
				kept[name] = q
			}
			cs[i].Resources.Requests = kept
		}
	}
	return out
}

// IsExtendedResource reports whether name is an extended resource
// (example.com/foo, a device plugin's), as Kubernetes' helper tells: not a
// native resource (no domain, or a kubernetes.io one) and not a
// "requests." quota name.
func IsExtendedResource(name v1.ResourceName) bool {
	s := string(name)
	domain, _, hasDomain := strings.Cut(s, "/")
	native := !hasDomain || domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io")
	return !native && !strings.HasPrefix(s, v1.DefaultResourceRequestsPrefix)
}

// portsConflict reports whether a hostPort of the pod's containers is
// taken by another pod's: the same protocol and port on the same host IP,
// or on any IP when either side binds all (0.0.0.0 or unset).
func portsConflict(pod *v1.Pod, others []*v1.Pod) bool {
	for _, want := range hostPorts(pod) {
		for _, o := range others {
			if slices.ContainsFunc(hostPorts(o), func(used v1.ContainerPort) bool {
				return used.HostPort == want.HostPort && used.Protocol == want.Protocol &&
					(used.HostIP == anyIP || want.HostIP == anyIP || used.HostIP == want.HostIP)
			}) {
				return true
			}
		}
	}
	return false
}

const anyIP = "0.0.0.0"

// hostPorts are the app containers' ports with a hostPort, with the
// scheduler's defaults for an empty IP and protocol.
func hostPorts(pod *v1.Pod) []v1.ContainerPort {
	var out []v1.ContainerPort
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort <= 0 {
				continue
			}
			if p.HostIP == "" {
				p.HostIP = anyIP
			}
			if p.Protocol == "" {
				p.Protocol = v1.ProtocolTCP
			}
			out = append(out, p)
		}
	}
	return out
}

// requests is what a pod takes of the node's allocatable, as the
// scheduler and kubelet count it: the larger of the app containers' and
// sidecars' sum and any init container's, plus the pod overhead.
func requests(pod *v1.Pod) v1.ResourceList {
	return resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
}

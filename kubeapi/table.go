package kubeapi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

// The columns and cells of server-side printing follow the API server's
// printers (k8s.io/kubernetes/pkg/printers/internalversion), so kubectl
// shows here what it shows against a cluster. The server always fills the
// wide columns (priority 1); kubectl shows them with -o wide.

var podColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
	{Name: "Ready", Type: "string", Description: "The aggregate readiness state of this pod for accepting traffic."},
	{Name: "Status", Type: "string", Description: "The aggregate status of the containers in this pod."},
	{Name: "Restarts", Type: "string", Description: "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."},
	{Name: "Age", Type: "string", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]},
	{Name: "IP", Type: "string", Priority: 1, Description: v1.PodStatus{}.SwaggerDoc()["podIP"]},
	{Name: "Node", Type: "string", Priority: 1, Description: v1.PodSpec{}.SwaggerDoc()["nodeName"]},
	{Name: "Nominated Node", Type: "string", Priority: 1, Description: v1.PodStatus{}.SwaggerDoc()["nominatedNodeName"]},
	{Name: "Readiness Gates", Type: "string", Priority: 1, Description: v1.PodSpec{}.SwaggerDoc()["readinessGates"]},
}

var eventColumns = []metav1.TableColumnDefinition{
	{Name: "Last Seen", Type: "string", Description: v1.Event{}.SwaggerDoc()["lastTimestamp"]},
	{Name: "Type", Type: "string", Description: v1.Event{}.SwaggerDoc()["type"]},
	{Name: "Reason", Type: "string", Description: v1.Event{}.SwaggerDoc()["reason"]},
	{Name: "Object", Type: "string", Description: v1.Event{}.SwaggerDoc()["involvedObject"]},
	{Name: "Subobject", Type: "string", Priority: 1, Description: v1.ObjectReference{}.SwaggerDoc()["fieldPath"]},
	{Name: "Source", Type: "string", Priority: 1, Description: v1.Event{}.SwaggerDoc()["source"]},
	{Name: "Message", Type: "string", Description: v1.Event{}.SwaggerDoc()["message"]},
	{Name: "First Seen", Type: "string", Priority: 1, Description: v1.Event{}.SwaggerDoc()["firstTimestamp"]},
	{Name: "Count", Type: "string", Priority: 1, Description: v1.Event{}.SwaggerDoc()["count"]},
	{Name: "Name", Type: "string", Priority: 1, Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
}

var nodeColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
	{Name: "Status", Type: "string", Description: "The status of the node"},
	{Name: "Roles", Type: "string", Description: "The roles of the node"},
	{Name: "Age", Type: "string", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]},
	{Name: "Version", Type: "string", Description: v1.NodeSystemInfo{}.SwaggerDoc()["kubeletVersion"]},
	{Name: "Internal-IP", Type: "string", Priority: 1, Description: v1.NodeStatus{}.SwaggerDoc()["addresses"]},
	{Name: "External-IP", Type: "string", Priority: 1, Description: v1.NodeStatus{}.SwaggerDoc()["addresses"]},
	{Name: "OS-Image", Type: "string", Priority: 1, Description: v1.NodeSystemInfo{}.SwaggerDoc()["osImage"]},
	{Name: "Kernel-Version", Type: "string", Priority: 1, Description: v1.NodeSystemInfo{}.SwaggerDoc()["kernelVersion"]},
	{Name: "Container-Runtime", Type: "string", Priority: 1, Description: v1.NodeSystemInfo{}.SwaggerDoc()["containerRuntimeVersion"]},
}

// since is the printers' age of a timestamp: "<unknown>" when unset.
func since(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func isRestartableInit(c *v1.Container) bool {
	return c != nil && c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

func podConditionTrue(p *v1.Pod, t v1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// podCells are a pod's cells as the API server's pod printer computes them.
func podCells(pod *v1.Pod, now time.Time) []any {
	restarts, sidecarRestarts := 0, 0
	total, ready := len(pod.Spec.Containers), 0
	var lastRestart, lastSidecarRestart time.Time
	later := func(t *time.Time, s *v1.ContainerStateTerminated) {
		if s != nil && s.FinishedAt.After(*t) {
			*t = s.FinishedAt.Time
		}
	}
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Reason == v1.PodReasonSchedulingGated {
			reason = v1.PodReasonSchedulingGated
		}
	}
	inits := map[string]*v1.Container{}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		inits[c.Name] = c
		if isRestartableInit(c) {
			total++
		}
	}
	initializing := false
	for i, cs := range pod.Status.InitContainerStatuses {
		restarts += int(cs.RestartCount)
		later(&lastRestart, cs.LastTerminationState.Terminated)
		sidecar := isRestartableInit(inits[cs.Name])
		if sidecar {
			sidecarRestarts += int(cs.RestartCount)
			later(&lastSidecarRestart, cs.LastTerminationState.Terminated)
		}
		t, w := cs.State.Terminated, cs.State.Waiting
		switch {
		case t != nil && t.ExitCode == 0:
			continue
		case sidecar && cs.Started != nil && *cs.Started:
			if cs.Ready {
				ready++
			}
			continue
		case t != nil:
			switch {
			case t.Reason != "":
				reason = "Init:" + t.Reason
			case t.Signal != 0:
				reason = fmt.Sprintf("Init:Signal:%d", t.Signal)
			default:
				reason = fmt.Sprintf("Init:ExitCode:%d", t.ExitCode)
			}
		case w != nil && w.Reason != "" && w.Reason != "PodInitializing":
			reason = "Init:" + w.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}
	if !initializing || podConditionTrue(pod, v1.PodInitialized) {
		restarts, lastRestart = sidecarRestarts, lastSidecarRestart
		running := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := pod.Status.ContainerStatuses[i]
			restarts += int(cs.RestartCount)
			later(&lastRestart, cs.LastTerminationState.Terminated)
			t, w := cs.State.Terminated, cs.State.Waiting
			switch {
			case w != nil && w.Reason != "":
				reason = w.Reason
			case t != nil && t.Reason != "":
				reason = t.Reason
			case t != nil && t.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", t.Signal)
			case t != nil:
				reason = fmt.Sprintf("ExitCode:%d", t.ExitCode)
			case cs.Ready && cs.State.Running != nil:
				running = true
				ready++
			}
		}
		// A pod whose last container completed while another runs.
		if reason == "Completed" && running {
			reason = "NotReady"
			if podConditionTrue(pod, v1.PodReady) {
				reason = "Running"
			}
		}
	}
	if pod.DeletionTimestamp != nil && pod.Status.Reason == "NodeLost" {
		reason = "Unknown"
	} else if pod.DeletionTimestamp != nil && pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
		reason = "Terminating"
	}
	restartText := strconv.Itoa(restarts)
	if restarts != 0 && !lastRestart.IsZero() {
		restartText = fmt.Sprintf("%d (%s ago)", restarts, duration.HumanDuration(now.Sub(lastRestart)))
	}
	ip, node, nominated := "<none>", "<none>", "<none>"
	if len(pod.Status.PodIPs) > 0 && pod.Status.PodIPs[0].IP != "" {
		ip = pod.Status.PodIPs[0].IP
	}
	if pod.Spec.NodeName != "" {
		node = pod.Spec.NodeName
	}
	if pod.Status.NominatedNodeName != "" {
		nominated = pod.Status.NominatedNodeName
	}
	gates := "<none>"
	if len(pod.Spec.ReadinessGates) > 0 {
		n := 0
		for _, g := range pod.Spec.ReadinessGates {
			if podConditionTrue(pod, g.ConditionType) {
				n++
			}
		}
		gates = fmt.Sprintf("%d/%d", n, len(pod.Spec.ReadinessGates))
	}
	return []any{pod.Name, fmt.Sprintf("%d/%d", ready, total), reason, restartText, since(pod.CreationTimestamp, now),
		ip, node, nominated, gates}
}

// podConditions are the row conditions the printer sets: kubectl greys out
// completed pods with them.
func podConditions(pod *v1.Pod) []metav1.TableRowCondition {
	switch pod.Status.Phase {
	case v1.PodSucceeded:
		return []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(v1.PodSucceeded), Message: "The pod has completed successfully."}}
	case v1.PodFailed:
		return []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(v1.PodFailed), Message: "The pod failed."}}
	}
	return nil
}

func eventCells(ev *v1.Event, now time.Time) []any {
	first := since(ev.FirstTimestamp, now)
	if ev.FirstTimestamp.IsZero() && !ev.EventTime.IsZero() {
		first = duration.HumanDuration(now.Sub(ev.EventTime.Time))
	}
	last := since(ev.LastTimestamp, now)
	if ev.LastTimestamp.IsZero() {
		last = first
	}
	count := ev.Count
	if ev.Series != nil {
		last, count = duration.HumanDuration(now.Sub(ev.Series.LastObservedTime.Time)), ev.Series.Count
	} else if count == 0 {
		count = 1
	}
	target := strings.ToLower(ev.InvolvedObject.Kind)
	if ev.InvolvedObject.Name != "" {
		target += "/" + ev.InvolvedObject.Name
	}
	component, instance := ev.Source.Component, ev.Source.Host
	if component == "" {
		component = ev.ReportingController
	}
	if instance == "" {
		instance = ev.ReportingInstance
	}
	source := component
	if instance != "" {
		source += ", " + instance
	}
	return []any{last, ev.Type, ev.Reason, target, ev.InvolvedObject.FieldPath, source,
		strings.TrimSpace(ev.Message), first, int64(count), ev.Name}
}

func nodeCells(n *v1.Node, now time.Time) []any {
	status := "Unknown"
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			status = "NotReady"
			if c.Status == v1.ConditionTrue {
				status = "Ready"
			}
		}
	}
	if n.Spec.Unschedulable {
		status += ",SchedulingDisabled"
	}
	roles := nodeRoles(n)
	address := func(t v1.NodeAddressType) string {
		for _, a := range n.Status.Addresses {
			if a.Type == t {
				return a.Address
			}
		}
		return "<none>"
	}
	unknown := func(s string) string {
		if s == "" {
			return "<unknown>"
		}
		return s
	}
	info := n.Status.NodeInfo
	return []any{n.Name, status, roles, since(n.CreationTimestamp, now), info.KubeletVersion,
		address(v1.NodeInternalIP), address(v1.NodeExternalIP),
		unknown(info.OSImage), unknown(info.KernelVersion), unknown(info.ContainerRuntimeVersion)}
}

// nodeRoles reads node-role.kubernetes.io/<role> and kubernetes.io/role
// labels, sorted and joined, or "<none>".
func nodeRoles(n *v1.Node) string {
	var roles []string
	add := func(r string) {
		if !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	for k, v := range n.Labels {
		if r, ok := strings.CutPrefix(k, "node-role.kubernetes.io/"); ok && r != "" {
			add(r)
		} else if k == "kubernetes.io/role" && v != "" {
			add(v)
		}
	}
	if len(roles) == 0 {
		return "<none>"
	}
	slices.Sort(roles)
	return strings.Join(roles, ",")
}

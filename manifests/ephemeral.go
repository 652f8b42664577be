package manifests

import (
	"fmt"
	"reflect"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// ephemeralForbidden are the container fields the API server refuses in an
// ephemeral container ("cannot be set for an Ephemeral Container"): a
// debugging container must not take part in the pod's ports, probes,
// lifecycle or resources (ValidateEphemeralContainers' allow list, turned
// around).
var ephemeralForbidden = []struct {
	field string
	set   func(c *v1.EphemeralContainerCommon) bool
}{
	{"ports", func(c *v1.EphemeralContainerCommon) bool { return len(c.Ports) > 0 }},
	{"resources", func(c *v1.EphemeralContainerCommon) bool {
		return !reflect.ValueOf(c.Resources).IsZero()
	}},
	{"resizePolicy", func(c *v1.EphemeralContainerCommon) bool { return len(c.ResizePolicy) > 0 }},
	{"restartPolicy", func(c *v1.EphemeralContainerCommon) bool { return c.RestartPolicy != nil }},
	{"restartPolicyRules", func(c *v1.EphemeralContainerCommon) bool { return len(c.RestartPolicyRules) > 0 }},
	{"livenessProbe", func(c *v1.EphemeralContainerCommon) bool { return c.LivenessProbe != nil }},
	{"readinessProbe", func(c *v1.EphemeralContainerCommon) bool { return c.ReadinessProbe != nil }},
	{"startupProbe", func(c *v1.EphemeralContainerCommon) bool { return c.StartupProbe != nil }},
	{"lifecycle", func(c *v1.EphemeralContainerCommon) bool { return c.Lifecycle != nil }},
}

// EphemeralContainers checks a new list of pod's ephemeral containers as
// the API server checks an update of its ephemeralcontainers subresource,
// and returns it defaulted. Those pod already has may be neither removed
// nor changed; each new one is a container as the pod's are (a unique
// name, an image, noderun's field table) without the fields an ephemeral
// container may not have, no subPath mounts, and a targetContainerName
// naming one of the pod's init or app containers. Errors are
// *ManifestError; warnings are the fields noderun ignores.
func EphemeralContainers(pod *v1.Pod, list []v1.EphemeralContainer) (out []v1.EphemeralContainer, errs, warnings []error) {
	out = make([]v1.EphemeralContainer, len(list))
	v := &validator{containers: map[string]bool{}, volumes: map[string]bool{}, hostNetwork: pod.Spec.HostNetwork}
	for i := range pod.Spec.Volumes {
		v.volumes[pod.Spec.Volumes[i].Name] = true
	}
	targets := map[string]bool{}
	for _, c := range allPodContainers(&pod.Spec) {
		v.containers[c.Name], targets[c.Name] = true, true
	}
	old := map[string]*v1.EphemeralContainer{}
	for i := range pod.Spec.EphemeralContainers {
		old[pod.Spec.EphemeralContainers[i].Name] = &pod.Spec.EphemeralContainers[i]
	}
	for i := range list {
		ec := list[i].DeepCopy()
		field := fmt.Sprintf("spec.ephemeralContainers[%d]", i)
		// No config objects: an ephemeral container's reference to one
		// is refused by name.
		fw := &fieldWalker{}
		fw.walkValue(reflect.ValueOf(ec.EphemeralContainerCommon), field, "container")
		findings := fw.out
		defaultContainer((*v1.Container)(&ec.EphemeralContainerCommon), pod.Spec.HostNetwork)
		out[i] = *ec
		if prev := old[ec.Name]; prev != nil {
			delete(old, ec.Name)
			v.containers[ec.Name] = true
			if !equality.Semantic.DeepEqual(prev, ec) {
				v.add("spec", "existing ephemeral containers %q may not be changed", ec.Name)
			}
			continue
		}
		fe, fwarn := fieldErrors(findings)
		errs, warnings = append(errs, fe...), append(warnings, fwarn...)
		v.ephemeral(ec, field, targets)
	}
	for _, ec := range pod.Spec.EphemeralContainers {
		if old[ec.Name] != nil {
			v.add("spec", "existing ephemeral containers %q may not be removed", ec.Name)
		}
	}
	return out, append(errs, v.errs...), warnings
}

// ephemeral checks one new ephemeral container.
func (v *validator) ephemeral(ec *v1.EphemeralContainer, field string, targets map[string]bool) {
	c := (*v1.Container)(&ec.EphemeralContainerCommon)
	for _, f := range ephemeralForbidden {
		if f.set(&ec.EphemeralContainerCommon) {
			v.add(field+"."+f.field, "Forbidden: cannot be set for an Ephemeral Container")
		}
	}
	for j, m := range ec.VolumeMounts {
		if m.SubPath != "" {
			v.add(fmt.Sprintf("%s.volumeMounts[%d].subPath", field, j), "Forbidden: cannot be set for an Ephemeral Container")
		}
		if m.SubPathExpr != "" {
			v.add(fmt.Sprintf("%s.volumeMounts[%d].subPathExpr", field, j), "Forbidden: cannot be set for an Ephemeral Container")
		}
	}
	if t := ec.TargetContainerName; t != "" && !targets[t] {
		v.add(field+".targetContainerName", "Not found: %q", t)
	}
	v.container(c, field)
}

// allPodContainers lists spec's init and app containers.
func allPodContainers(spec *v1.PodSpec) []*v1.Container {
	out := make([]*v1.Container, 0, len(spec.InitContainers)+len(spec.Containers))
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

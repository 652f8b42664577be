package manifests

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// ApplyDefaults fills in what the API server would default on create, so the
// runner sees the same pod a kubelet would. It never overrides a set value.
func ApplyDefaults(pod *v1.Pod) {
	spec := &pod.Spec
	setIfEmpty(&spec.RestartPolicy, v1.RestartPolicyAlways)
	setIfEmpty(&spec.DNSPolicy, v1.DNSClusterFirst)
	setIfEmpty(&spec.SchedulerName, v1.DefaultSchedulerName)
	if spec.TerminationGracePeriodSeconds == nil {
		spec.TerminationGracePeriodSeconds = ptr(int64(v1.DefaultTerminationGracePeriodSeconds))
	}
	if spec.EnableServiceLinks == nil {
		spec.EnableServiceLinks = ptr(v1.DefaultEnableServiceLinks)
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &v1.PodSecurityContext{}
	}
	for i := range spec.InitContainers {
		defaultContainer(&spec.InitContainers[i], spec.HostNetwork)
	}
	for i := range spec.Containers {
		defaultContainer(&spec.Containers[i], spec.HostNetwork)
	}
	for i := range spec.Volumes {
		defaultVolume(&spec.Volumes[i])
	}
}

func defaultContainer(c *v1.Container, hostNetwork bool) {
	setIfEmpty(&c.ImagePullPolicy, pullPolicy(c.Image))
	setIfEmpty(&c.TerminationMessagePath, v1.TerminationMessagePathDefault)
	setIfEmpty(&c.TerminationMessagePolicy, v1.TerminationMessageReadFile)
	for i := range c.Ports {
		p := &c.Ports[i]
		setIfEmpty(&p.Protocol, v1.ProtocolTCP)
		// With the host's network the container port is the host port.
		if hostNetwork && p.HostPort == 0 {
			p.HostPort = p.ContainerPort
		}
	}
	// Limits without requests mean requests equal to the limits.
	if len(c.Resources.Limits) > 0 && c.Resources.Requests == nil {
		c.Resources.Requests = v1.ResourceList{}
	}
	for name, q := range c.Resources.Limits {
		if _, ok := c.Resources.Requests[name]; !ok {
			c.Resources.Requests[name] = q.DeepCopy()
		}
	}
	for i := range c.Env {
		if ref := c.Env[i].ValueFrom; ref != nil && ref.FieldRef != nil {
			setIfEmpty(&ref.FieldRef.APIVersion, "v1")
		}
	}
	for _, p := range []*v1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		defaultProbe(p)
	}
	if c.Lifecycle != nil {
		for _, h := range []*v1.LifecycleHandler{c.Lifecycle.PostStart, c.Lifecycle.PreStop} {
			if h != nil {
				defaultHTTPGet(h.HTTPGet)
			}
		}
	}
}

// pullPolicy is Always for a floating reference (tag latest or none, no
// digest) and IfNotPresent for a pinned one.
func pullPolicy(image string) v1.PullPolicy {
	if strings.Contains(image, "@") {
		return v1.PullIfNotPresent
	}
	// A ':' before the last '/' is a registry port, not a tag.
	name := image[strings.LastIndex(image, "/")+1:]
	if i := strings.LastIndex(name, ":"); i < 0 || name[i+1:] == "latest" {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}

func defaultProbe(p *v1.Probe) {
	if p == nil {
		return
	}
	setIfZero(&p.TimeoutSeconds, 1)
	setIfZero(&p.PeriodSeconds, 10)
	setIfZero(&p.SuccessThreshold, 1)
	setIfZero(&p.FailureThreshold, 3)
	defaultHTTPGet(p.HTTPGet)
}

func defaultHTTPGet(h *v1.HTTPGetAction) {
	if h == nil {
		return
	}
	setIfEmpty(&h.Path, "/")
	setIfEmpty(&h.Scheme, v1.URISchemeHTTP)
}

func defaultVolume(v *v1.Volume) {
	if img := v.Image; img != nil && img.PullPolicy == "" {
		// The API server's rule, the container image's: Always for
		// :latest (or no tag), else IfNotPresent.
		img.PullPolicy = pullPolicy(img.Reference)
	}
	if hp := v.HostPath; hp != nil && hp.Type == nil {
		hp.Type = ptr(v1.HostPathUnset)
	}
	if d := v.DownwardAPI; d != nil {
		if d.DefaultMode == nil {
			d.DefaultMode = ptr(v1.DownwardAPIVolumeSourceDefaultMode)
		}
		defaultFieldRefs(d.Items)
	}
	if c := v.ConfigMap; c != nil && c.DefaultMode == nil {
		c.DefaultMode = ptr(v1.ConfigMapVolumeSourceDefaultMode)
	}
	if s := v.Secret; s != nil && s.DefaultMode == nil {
		s.DefaultMode = ptr(v1.SecretVolumeSourceDefaultMode)
	}
	if p := v.Projected; p != nil {
		if p.DefaultMode == nil {
			p.DefaultMode = ptr(v1.ProjectedVolumeSourceDefaultMode)
		}
		for _, s := range p.Sources {
			if s.DownwardAPI != nil {
				defaultFieldRefs(s.DownwardAPI.Items)
			}
		}
	}
}

func defaultFieldRefs(items []v1.DownwardAPIVolumeFile) {
	for i := range items {
		if ref := items[i].FieldRef; ref != nil {
			setIfEmpty(&ref.APIVersion, "v1")
		}
	}
}

func setIfEmpty[T ~string](p *T, v T) {
	if *p == "" {
		*p = v
	}
}

func setIfZero(p *int32, v int32) {
	if *p == 0 {
		*p = v
	}
}

func ptr[T any](v T) *T { return &v }

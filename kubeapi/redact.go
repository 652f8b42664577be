package kubeapi

import (
	v1 "k8s.io/api/core/v1"
)

// redacted replaces, for the view token, values that may be secrets.
const redacted = "(redacted for the view token)"

// lastApplied is kubectl's copy of a whole object, env values included.
const lastApplied = v1.LastAppliedConfigAnnotation

// redactPod is the pod as the view token sees it. Static pods have no
// Secret objects, so credentials sit inline in the manifest: env values,
// and the headers of HTTP probes and hooks (an Authorization header); an
// object exported from a cluster also carries them in kubectl's
// last-applied annotation. Those are replaced; the rest (commands, images,
// annotations, status) is read as it is. The pod is copied only when
// something is replaced: the store's objects are shared.
func redactPod(p v1.Pod) v1.Pod {
	if !podHasSecrets(&p) {
		return p
	}
	c := p.DeepCopy()
	if _, ok := c.Annotations[lastApplied]; ok {
		c.Annotations[lastApplied] = redacted
	}
	forEachContainer(&c.Spec, func(ct *v1.Container) {
		for i := range ct.Env {
			if ct.Env[i].Value != "" {
				ct.Env[i].Value = redacted
			}
		}
		forEachHTTPGet(ct, func(h *v1.HTTPGetAction) {
			for i := range h.HTTPHeaders {
				h.HTTPHeaders[i].Value = redacted
			}
		})
	})
	return *c
}

// podHasSecrets tells whether redactPod replaces anything in p.
func podHasSecrets(p *v1.Pod) bool {
	_, found := p.Annotations[lastApplied]
	forEachContainer(&p.Spec, func(ct *v1.Container) {
		for _, e := range ct.Env {
			found = found || e.Value != ""
		}
		forEachHTTPGet(ct, func(h *v1.HTTPGetAction) { found = found || len(h.HTTPHeaders) > 0 })
	})
	return found
}

// forEachContainer calls f with each container of spec, ephemeral ones as
// the containers they are.
func forEachContainer(spec *v1.PodSpec, f func(*v1.Container)) {
	for i := range spec.InitContainers {
		f(&spec.InitContainers[i])
	}
	for i := range spec.Containers {
		f(&spec.Containers[i])
	}
	for i := range spec.EphemeralContainers {
		f((*v1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
}

// forEachHTTPGet calls f with each HTTP action of the container's probes
// and lifecycle hooks.
func forEachHTTPGet(c *v1.Container, f func(*v1.HTTPGetAction)) {
	for _, p := range []*v1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p != nil && p.HTTPGet != nil {
			f(p.HTTPGet)
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, h := range []*v1.LifecycleHandler{l.PostStart, l.PreStop} {
			if h != nil && h.HTTPGet != nil {
				f(h.HTTPGet)
			}
		}
	}
}

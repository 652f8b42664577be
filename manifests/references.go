package manifests

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// reference is one use a pod makes of a ConfigMap or Secret.
type reference struct {
	field    string // where the pod says it
	kind     string // KindConfigMap or KindSecret
	name     string
	keys     []string // the keys it needs: a key selector's, a volume's items
	optional bool
	env      bool // read at container start (CreateContainerConfigError), else a volume (FailedMount)
}

// references lists the pod's uses of ConfigMaps and Secrets.
func references(pod *v1.Pod) []reference {
	var out []reference
	itemKeys := func(items []v1.KeyToPath) []string {
		keys := make([]string, len(items))
		for i, it := range items {
			keys[i] = it.Key
		}
		return keys
	}
	for i, v := range pod.Spec.Volumes {
		f := fmt.Sprintf("spec.volumes[%d]", i)
		switch {
		case v.ConfigMap != nil:
			out = append(out, reference{f + ".configMap", KindConfigMap, v.ConfigMap.Name, itemKeys(v.ConfigMap.Items), isSet(v.ConfigMap.Optional), false})
		case v.Secret != nil:
			out = append(out, reference{f + ".secret", KindSecret, v.Secret.SecretName, itemKeys(v.Secret.Items), isSet(v.Secret.Optional), false})
		case v.Projected != nil:
			for j, s := range v.Projected.Sources {
				sf := fmt.Sprintf("%s.projected.sources[%d]", f, j)
				if s.ConfigMap != nil {
					out = append(out, reference{sf + ".configMap", KindConfigMap, s.ConfigMap.Name, itemKeys(s.ConfigMap.Items), isSet(s.ConfigMap.Optional), false})
				}
				if s.Secret != nil {
					out = append(out, reference{sf + ".secret", KindSecret, s.Secret.Name, itemKeys(s.Secret.Items), isSet(s.Secret.Optional), false})
				}
			}
		}
	}
	for _, c := range allContainers(pod) {
		for i, e := range c.container.EnvFrom {
			f := fmt.Sprintf("%s.envFrom[%d]", c.field, i)
			if r := e.ConfigMapRef; r != nil {
				out = append(out, reference{f + ".configMapRef", KindConfigMap, r.Name, nil, isSet(r.Optional), true})
			}
			if r := e.SecretRef; r != nil {
				out = append(out, reference{f + ".secretRef", KindSecret, r.Name, nil, isSet(r.Optional), true})
			}
		}
		for i, e := range c.container.Env {
			f := fmt.Sprintf("%s.env[%d].valueFrom", c.field, i)
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				out = append(out, reference{f + ".configMapKeyRef", KindConfigMap, r.Name, []string{r.Key}, isSet(r.Optional), true})
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				out = append(out, reference{f + ".secretKeyRef", KindSecret, r.Name, []string{r.Key}, isSet(r.Optional), true})
			}
		}
	}
	return out
}

type namedContainer struct {
	field     string
	container *v1.Container
}

func allContainers(pod *v1.Pod) []namedContainer {
	var out []namedContainer
	for i := range pod.Spec.InitContainers {
		out = append(out, namedContainer{fmt.Sprintf("spec.initContainers[%d]", i), &pod.Spec.InitContainers[i]})
	}
	for i := range pod.Spec.Containers {
		out = append(out, namedContainer{fmt.Sprintf("spec.containers[%d]", i), &pod.Spec.Containers[i]})
	}
	return out
}

func isSet(p *bool) bool { return p != nil && *p }

// ReferenceErrors finds, across snaps (a node's sources), each pod's
// references to a ConfigMap, Secret or key that none of them defines and
// that are not optional: on the node the container would wait in
// CreateContainerConfigError, or the pod in ContainerCreating (FailedMount),
// until a document defines it. Errors are by pod UID, with the field.
func ReferenceErrors(snaps []Snapshot) map[types.UID][]*ManifestError {
	keys := map[string]map[string]bool{} // "Kind namespace/name" -> keys
	for _, s := range snaps {
		for _, cm := range s.ConfigMaps {
			k := map[string]bool{}
			for key := range cm.Data {
				k[key] = true
			}
			for key := range cm.BinaryData {
				k[key] = true
			}
			keys[KindConfigMap+" "+cm.Namespace+"/"+cm.Name] = k
		}
		for _, sec := range s.Secrets {
			k := map[string]bool{}
			for key := range sec.Data {
				k[key] = true
			}
			keys[KindSecret+" "+sec.Namespace+"/"+sec.Name] = k
		}
	}
	out := map[types.UID][]*ManifestError{}
	for _, s := range snaps {
		for _, pod := range s.Pods {
			for _, r := range references(pod) {
				if me := r.check(pod.Namespace, keys); me != nil {
					out[pod.UID] = append(out[pod.UID], me)
				}
			}
		}
	}
	return out
}

// check is the reference's error, nil when it holds or is optional.
func (r reference) check(namespace string, keys map[string]map[string]bool) *ManifestError {
	if r.optional {
		return nil
	}
	effect := "the pod would wait in ContainerCreating (FailedMount)"
	if r.env {
		effect = "the container would not start (CreateContainerConfigError)"
	}
	have, ok := keys[r.kind+" "+namespace+"/"+r.name]
	if !ok {
		resource := "configmap"
		if r.kind == KindSecret {
			resource = "secret"
		}
		return &ManifestError{Field: r.field, Message: fmt.Sprintf("%s %q not found in the manifest sources: %s", resource, r.name, effect)}
	}
	for _, k := range r.keys {
		if !have[k] {
			return &ManifestError{Field: r.field, Message: fmt.Sprintf("%s %s/%s has no key %q: %s", r.kind, namespace, r.name, k, effect)}
		}
	}
	return nil
}

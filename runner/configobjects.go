package runner

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/manifests"
)

// configObjects holds the ConfigMaps and Secrets of every source
// (--local-config-objects), for workers to read. Secrets live here, in
// memory, and in the pods' tmpfs volumes only: a restart reads them from
// the manifest sources again.
type configObjects struct {
	mu         sync.RWMutex
	rev        uint64 // bumped when any object changes
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

// errNotFound is the kubelet's error for a missing object, as its
// configMap and secret managers word it (`configmap "x" not found`).
type errNotFound struct{ resource, name string }

func (e *errNotFound) Error() string { return fmt.Sprintf("%s %q not found", e.resource, e.name) }

// set takes the objects of every source, the first source by name winning
// a namespace/name two define, and reports whether any changed.
func (c *configObjects) set(sources map[string]manifests.Snapshot) bool {
	cms, secrets := map[string]*v1.ConfigMap{}, map[string]*v1.Secret{}
	for _, name := range slices.Sorted(maps.Keys(sources)) {
		for _, cm := range sources[name].ConfigMaps {
			if k := cm.Namespace + "/" + cm.Name; cms[k] == nil {
				cms[k] = cm
			}
		}
		for _, s := range sources[name].Secrets {
			if k := s.Namespace + "/" + s.Name; secrets[k] == nil {
				secrets[k] = s
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Sources hand out new objects only when a document changed (or its
	// file was read again): pointers tell, and a false alarm only makes
	// workers find their volumes as they are.
	if maps.Equal(cms, c.configMaps) && maps.Equal(secrets, c.secrets) {
		return false
	}
	c.configMaps, c.secrets = cms, secrets
	c.rev++
	return true
}

// revision is the objects' version, for workers to tell a change.
func (c *configObjects) revision() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// configMap returns the ConfigMap namespace/name, or the kubelet's
// not-found error.
func (c *configObjects) configMap(namespace, name string) (*v1.ConfigMap, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if cm := c.configMaps[namespace+"/"+name]; cm != nil {
		return cm, nil
	}
	return nil, &errNotFound{"configmap", name}
}

// secret returns the Secret namespace/name, or the kubelet's not-found
// error.
func (c *configObjects) secret(namespace, name string) (*v1.Secret, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if s := c.secrets[namespace+"/"+name]; s != nil {
		return s, nil
	}
	return nil, &errNotFound{"secret", name}
}

// envFrom resolves a container's envFrom, in order, each source's keys
// sorted (the kubelet's map has no order), a later source's key winning.
func (c *configObjects) envFrom(pod *v1.Pod, ctr *v1.Container) ([]envVar, error) {
	var out []envVar
	for _, e := range ctr.EnvFrom {
		var data map[string]string
		switch {
		case e.ConfigMapRef != nil:
			cm, err := c.configMap(pod.Namespace, e.ConfigMapRef.Name)
			if err != nil {
				if optional(e.ConfigMapRef.Optional) {
					continue
				}
				return nil, err
			}
			data = cm.Data
		case e.SecretRef != nil:
			s, err := c.secret(pod.Namespace, e.SecretRef.Name)
			if err != nil {
				if optional(e.SecretRef.Optional) {
					continue
				}
				return nil, err
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			out = append(out, envVar{e.Prefix + k, data[k]})
		}
	}
	return out, nil
}

// keyRef resolves an env variable's configMapKeyRef or secretKeyRef; ok is
// false when an optional one is missing and the variable is left out.
func (c *configObjects) keyRef(pod *v1.Pod, src *v1.EnvVarSource) (val string, ok bool, err error) {
	if r := src.ConfigMapKeyRef; r != nil {
		cm, err := c.configMap(pod.Namespace, r.Name)
		if err != nil {
			return "", false, skipOptional(err, r.Optional)
		}
		v, found := cm.Data[r.Key]
		if !found && !optional(r.Optional) {
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", r.Key, pod.Namespace, r.Name)
		}
		return v, found, nil
	}
	r := src.SecretKeyRef
	s, err := c.secret(pod.Namespace, r.Name)
	if err != nil {
		return "", false, skipOptional(err, r.Optional)
	}
	v, found := s.Data[r.Key]
	if !found && !optional(r.Optional) {
		return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", r.Key, pod.Namespace, r.Name)
	}
	return string(v), found, nil
}

func optional(p *bool) bool { return p != nil && *p }

// skipOptional drops a not-found error of an optional reference.
func skipOptional(err error, opt *bool) error {
	if optional(opt) {
		return nil
	}
	return err
}

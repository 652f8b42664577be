package manifests

import (
	"fmt"
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks the API server makes on references to ConfigMaps and Secrets
// (ValidateKeyToPath, the projections, envFrom, the key selectors), so that
// a manifest that works here is one it accepts.

func (v *validator) configMapVolume(field string, src *v1.ConfigMapVolumeSource) {
	if src.Name == "" {
		v.add(field+".name", "Required value")
	}
	v.fileMode(field+".defaultMode", src.DefaultMode)
	v.keyToPaths(field+".items", src.Items)
}

func (v *validator) secretVolume(field string, src *v1.SecretVolumeSource) {
	if src.SecretName == "" {
		v.add(field+".secretName", "Required value")
	}
	v.fileMode(field+".defaultMode", src.DefaultMode)
	v.keyToPaths(field+".items", src.Items)
}

// projected checks each source and that no two write the same path.
func (v *validator) projected(field string, p *v1.ProjectedVolumeSource) {
	v.fileMode(field+".defaultMode", p.DefaultMode)
	paths := map[string]bool{}
	for i, s := range p.Sources {
		f := fmt.Sprintf("%s.sources[%d]", field, i)
		var items []string
		n := 0
		keyed := func(sf, name string, list []v1.KeyToPath) {
			n++
			if name == "" {
				v.add(sf+".name", "Required value")
			}
			v.keyToPaths(sf+".items", list)
			items = append(items, keyPaths(list)...)
		}
		if s.ConfigMap != nil {
			keyed(f+".configMap", s.ConfigMap.Name, s.ConfigMap.Items)
		}
		if s.Secret != nil {
			keyed(f+".secret", s.Secret.Name, s.Secret.Items)
		}
		if s.DownwardAPI != nil {
			n++
			v.downwardAPI(f+".downwardAPI", &v1.DownwardAPIVolumeSource{Items: s.DownwardAPI.Items})
			for _, it := range s.DownwardAPI.Items {
				items = append(items, it.Path)
			}
		}
		if s.ServiceAccountToken != nil || s.ClusterTrustBundle != nil || s.PodCertificate != nil {
			n++ // a source of its own, refused by the field table
		}
		if n != 1 {
			v.add(f, "exactly one of configMap, secret and downwardAPI is required")
		}
		for _, p := range items {
			if paths[p] {
				v.add(f, "conflicting duplicate paths: %s", p)
			}
			paths[p] = true
		}
	}
}

func keyPaths(items []v1.KeyToPath) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Path
	}
	return out
}

func (v *validator) keyToPaths(field string, items []v1.KeyToPath) {
	for i, it := range items {
		f := fmt.Sprintf("%s[%d]", field, i)
		if it.Key == "" {
			v.add(f+".key", "Required value")
		}
		v.itemPath(f+".path", it.Path)
		v.fileMode(f+".mode", it.Mode)
	}
}

// itemPath is a file's path inside an API-data volume: relative, without
// '..' parts, not starting with '..' (the writer's own names).
func (v *validator) itemPath(field, p string) {
	if p == "" || path.IsAbs(p) || hasDotDot(p) || strings.HasPrefix(p, "..") {
		v.add(field, "must be a relative path without '..' that does not start with '..'")
	}
}

func (v *validator) fileMode(field string, mode *int32) {
	if mode != nil && (*mode < 0 || *mode > 0o777) {
		v.add(field, "must be a number between 0 and 0777 (octal), both inclusive")
	}
}

// keyRef checks an env variable's configMapKeyRef or secretKeyRef.
func (v *validator) keyRef(field string, src *v1.EnvVarSource) {
	check := func(f, name, key string) {
		if name == "" {
			v.add(f+".name", "Required value")
		}
		if key == "" {
			v.add(f+".key", "Required value")
		} else {
			v.check(f+".key", validation.IsConfigMapKey(key))
		}
	}
	if r := src.ConfigMapKeyRef; r != nil {
		check(field+".configMapKeyRef", r.Name, r.Key)
	}
	if r := src.SecretKeyRef; r != nil {
		check(field+".secretKeyRef", r.Name, r.Key)
	}
}

func (v *validator) envFrom(c *v1.Container, field string) {
	for i, e := range c.EnvFrom {
		f := fmt.Sprintf("%s.envFrom[%d]", field, i)
		if e.Prefix != "" {
			v.check(f+".prefix", validation.IsRelaxedEnvVarName(e.Prefix))
		}
		switch {
		case (e.ConfigMapRef == nil) == (e.SecretRef == nil):
			v.add(f, "exactly one of configMapRef and secretRef is required")
		case e.ConfigMapRef != nil && e.ConfigMapRef.Name == "":
			v.add(f+".configMapRef.name", "Required value")
		case e.SecretRef != nil && e.SecretRef.Name == "":
			v.add(f+".secretRef.name", "Required value")
		}
	}
}

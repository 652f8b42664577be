package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// parseOptions are a source's settings that change what a manifest means.
type parseOptions struct {
	// localConfig: ConfigMap and Secret documents are read, and pods may
	// refer to them (--local-config-objects).
	localConfig bool
}

// Kinds of the config objects a source may yield.
const (
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// maxObjectSize is the API server's bound on a ConfigMap's or Secret's
// data (corev1.MaxSecretSize).
const maxObjectSize = 1 << 20

// objectEntry is an accepted ConfigMap or Secret and where it came from.
type objectEntry struct {
	cm     *v1.ConfigMap // one of cm and secret is set
	secret *v1.Secret
	line   int
	sum    string // hash of the content: a change shows without the values
	stale  bool   // kept from an earlier version: the current one has errors
}

func (o objectEntry) kind() string {
	if o.secret != nil {
		return KindSecret
	}
	return KindConfigMap
}

func (o objectEntry) meta() (namespace, name string) {
	if o.secret != nil {
		return o.secret.Namespace, o.secret.Name
	}
	return o.cm.Namespace, o.cm.Name
}

// key is how an object is matched across versions and between sources.
func (o objectEntry) key() string {
	ns, name := o.meta()
	return o.kind() + " " + ns + "/" + name
}

// immutable reports whether the object says immutable: true.
func (o objectEntry) immutable() bool {
	if o.secret != nil {
		return o.secret.Immutable != nil && *o.secret.Immutable
	}
	return o.cm.Immutable != nil && *o.cm.Immutable
}

// ObjectInfo is one ConfigMap or Secret a source yields: where, never what.
type ObjectInfo struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	File      string `json:"file,omitempty"`
	Line      int    `json:"line,omitempty"`
	// LastKnownGood: the manifest now has errors, so the object keeps its
	// last valid content.
	LastKnownGood bool `json:"lastKnownGood,omitempty"`
}

func objectInfo(file string, o objectEntry) ObjectInfo {
	ns, name := o.meta()
	return ObjectInfo{Kind: o.kind(), Namespace: ns, Name: name, File: file, Line: o.line, LastKnownGood: o.stale}
}

// decodeObject decodes a ConfigMap or Secret document strictly.
func decodeObject(kind string, js []byte, c chunk) ([]document, []error) {
	if kind == KindConfigMap {
		cm := &v1.ConfigMap{}
		if errs := decodeStrict(js, cm, c); len(errs) > 0 {
			return nil, errs
		}
		return []document{{obj: &objectEntry{cm: cm}}}, nil
	}
	s := &v1.Secret{}
	if errs := decodeStrict(js, s, c); len(errs) > 0 {
		return nil, hideSecretValues(errs)
	}
	return []document{{obj: &objectEntry{secret: s}}}, nil
}

// hideSecretValues rewrites the type errors of a Secret's values, which
// quote what they found, so that no value reaches a log or an event.
func hideSecretValues(errs []error) []error {
	for _, err := range errs {
		me, ok := err.(*ManifestError)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(me.Field, "data."):
			me.Message, me.Err = "must be a base64 string (the value is not shown)", nil
		case strings.HasPrefix(me.Field, "stringData."):
			me.Message, me.Err = "must be a string (the value is not shown)", nil
		case me.Field == "":
			// The decoder's own words name no value (illegal base64 data
			// at input byte N), but keep them out of doubt.
			me.Message = "invalid Secret: " + me.Detail()
			me.Err = nil
		}
	}
	return errs
}

// acceptObject defaults and validates an object as the API server does,
// and returns its errors, each with a field path.
func acceptObject(o *objectEntry) []error {
	v := &validator{}
	if o.cm != nil {
		setIfEmpty(&o.cm.Namespace, "default")
		v.objectMeta(o.cm.Name, o.cm.Namespace)
		v.configMapData(o.cm)
	} else {
		setIfEmpty(&o.secret.Namespace, "default")
		setIfEmpty(&o.secret.Type, v1.SecretTypeOpaque)
		// stringData is write-only: the API server merges it into data,
		// its values winning.
		for k, val := range o.secret.StringData {
			if o.secret.Data == nil {
				o.secret.Data = map[string][]byte{}
			}
			o.secret.Data[k] = []byte(val)
		}
		o.secret.StringData = nil
		v.objectMeta(o.secret.Name, o.secret.Namespace)
		v.secretData(o.secret)
	}
	o.sum = objectSum(*o)
	return v.errs
}

func (v *validator) objectMeta(name, namespace string) {
	if name == "" {
		v.add("metadata.name", "name is required")
	} else {
		v.check("metadata.name", validation.IsDNS1123Subdomain(name))
	}
	v.check("metadata.namespace", validation.IsDNS1123Label(namespace))
}

// configMapData checks keys and size as ValidateConfigMap does.
func (v *validator) configMapData(cm *v1.ConfigMap) {
	size := 0
	for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
		v.check("data["+k+"]", validation.IsConfigMapKey(k))
		size += len(cm.Data[k])
	}
	for _, k := range slices.Sorted(maps.Keys(cm.BinaryData)) {
		v.check("binaryData["+k+"]", validation.IsConfigMapKey(k))
		if _, dup := cm.Data[k]; dup {
			v.add("binaryData["+k+"]", "duplicate of key present in data")
		}
		size += len(cm.BinaryData[k])
	}
	if size > maxObjectSize {
		v.add("data", "Too long: must have at most %d bytes", maxObjectSize)
	}
}

// secretData checks keys, size and the keys each built-in type requires,
// as ValidateSecret does.
func (v *validator) secretData(s *v1.Secret) {
	size := 0
	for _, k := range slices.Sorted(maps.Keys(s.Data)) {
		v.check("data["+k+"]", validation.IsConfigMapKey(k))
		size += len(s.Data[k])
	}
	if size > maxObjectSize {
		v.add("data", "Too long: must have at most %d bytes", maxObjectSize)
	}
	need := func(keys ...string) {
		for _, k := range keys {
			if _, ok := s.Data[k]; !ok {
				v.add("data["+k+"]", "Required value")
			}
		}
	}
	validJSON := func(k string) {
		if b, ok := s.Data[k]; ok && !json.Valid(b) {
			v.add("data["+k+"]", "Invalid value: <secret contents redacted>: invalid JSON")
		}
	}
	switch s.Type {
	case v1.SecretTypeServiceAccountToken:
		v.add("type", "service account tokens need an API server to issue them")
	case v1.SecretTypeDockercfg:
		need(v1.DockerConfigKey)
		validJSON(v1.DockerConfigKey)
	case v1.SecretTypeDockerConfigJson:
		need(v1.DockerConfigJsonKey)
		validJSON(v1.DockerConfigJsonKey)
	case v1.SecretTypeBasicAuth:
		_, user := s.Data[v1.BasicAuthUsernameKey]
		_, pass := s.Data[v1.BasicAuthPasswordKey]
		if !user && !pass {
			v.add("data[username]", "Required value")
			v.add("data[password]", "Required value")
		}
	case v1.SecretTypeSSHAuth:
		need(v1.SSHAuthPrivateKey)
	case v1.SecretTypeTLS:
		need(v1.TLSCertKey, v1.TLSPrivateKeyKey)
	}
}

// objectSum hashes what a pod sees of an object, so that a change is seen
// without the values being kept anywhere but in memory.
func objectSum(o objectEntry) string {
	h := sha256.New()
	var b []byte
	if o.cm != nil {
		b, _ = json.Marshal(struct {
			D map[string]string
			B map[string][]byte
			I *bool
		}{o.cm.Data, o.cm.BinaryData, o.cm.Immutable})
	} else {
		b, _ = json.Marshal(struct {
			D map[string][]byte
			T v1.SecretType
			I *bool
		}{o.secret.Data, o.secret.Type, o.secret.Immutable})
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// checkImmutable refuses a new version of an object that was immutable
// and changed, as the API server refuses such an update; the old version
// stays (see keepLastGood).
func checkImmutable(prev, next *fileResult) {
	if prev == nil {
		return
	}
	old := map[string]objectEntry{}
	for _, o := range prev.objects {
		old[o.key()] = o
	}
	kept := next.objects[:0]
	for _, o := range next.objects {
		if p, ok := old[o.key()]; ok && p.immutable() && p.sum != o.sum {
			ns, name := o.meta()
			next.errs = append(next.errs, &ManifestError{File: next.file, Line: o.line, Field: "data",
				Message: fmt.Sprintf("%s %s/%s: field is immutable when `immutable` is set", o.kind(), ns, name)})
			continue
		}
		kept = append(kept, o)
	}
	next.objects = kept
}

// withoutSecrets returns data without its Secret documents, and whether
// there were any.
func withoutSecrets(data []byte) ([]byte, bool) {
	var out [][]byte
	cut := false
	for _, c := range splitDocuments(data) {
		var tm struct {
			Kind string `json:"kind"`
		}
		if js, err := yaml.YAMLToJSON(c.text); err == nil && json.Unmarshal(js, &tm) == nil && tm.Kind == KindSecret {
			cut = true
			continue
		}
		out = append(out, c.text)
	}
	return bytes.Join(out, []byte("---\n")), cut
}

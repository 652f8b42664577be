package manifests

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// The deprecated AppArmor annotations (container.apparmor.security.beta.
// kubernetes.io/<container>) on a static pod, as Kubernetes v1.37 has them:
// the kubelet validates them as the API server does (ValidatePodCreate:
// the container exists, the value is runtime/default, unconfined or
// localhost/<name>, and it matches the field where both are set) and,
// copying nothing to the fields, uses an annotation for its container in
// place of the pod's field (pkg/security/apparmor GetProfile: container
// field, annotation, pod field). The API server warns of each; so does
// noderun.

// appArmorAnnotations validates the pod's AppArmor annotations.
func (v *validator) appArmorAnnotations(pod *v1.Pod) {
	var podProfile *v1.AppArmorProfile
	if sc := pod.Spec.SecurityContext; sc != nil {
		podProfile = sc.AppArmorProfile
	}
	for _, key := range slices.Sorted(maps.Keys(pod.Annotations)) {
		name, ok := strings.CutPrefix(key, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix)
		if !ok {
			continue
		}
		f, val := fmt.Sprintf("metadata.annotations[%s]", key), pod.Annotations[key]
		c, cf := podContainer(&pod.Spec, name)
		if c == nil {
			v.add(f, "Invalid value: %q: container not found", name)
		}
		if val != "" && val != v1.DeprecatedAppArmorBetaProfileRuntimeDefault && val != v1.DeprecatedAppArmorBetaProfileNameUnconfined &&
			!strings.HasPrefix(val, v1.DeprecatedAppArmorBetaProfileNamePrefix) {
			v.add(f, "Invalid value: %q: invalid AppArmor profile name: %q", val, val)
		}
		if c != nil {
			v.appArmorMatches(c, cf, val, podProfile)
		}
	}
}

// appArmorMatches refuses an annotation that says otherwise than the
// field in force for its container (validateAppArmorAnnotationsAndFields
// MatchOnCreate).
func (v *validator) appArmorMatches(c *v1.Container, cf, val string, p *v1.AppArmorProfile) {
	if c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
		p = c.SecurityContext.AppArmorProfile
	}
	if p == nil {
		return
	}
	f := cf + ".securityContext.appArmorProfile"
	switch p.Type {
	case v1.AppArmorProfileTypeUnconfined, v1.AppArmorProfileTypeRuntimeDefault:
		if want := map[v1.AppArmorProfileType]string{v1.AppArmorProfileTypeUnconfined: v1.DeprecatedAppArmorBetaProfileNameUnconfined,
			v1.AppArmorProfileTypeRuntimeDefault: v1.DeprecatedAppArmorBetaProfileRuntimeDefault}[p.Type]; val != want {
			v.add(f+".type", "apparmor type in annotation and field must match")
		}
	case v1.AppArmorProfileTypeLocalhost:
		name, ok := strings.CutPrefix(val, v1.DeprecatedAppArmorBetaProfileNamePrefix)
		if !ok {
			v.add(f+".type", "apparmor type in annotation and field must match")
		} else if p.LocalhostProfile == nil || *p.LocalhostProfile != name {
			v.add(f+".localhostProfile", "apparmor profile in annotation and field must match")
		}
	}
}

// appArmorWarnings are the API server's deprecation warnings for the pod's
// AppArmor annotations (applyAppArmorVersionSkew): of a container without a
// field, unless the annotation says what the pod's field says.
func appArmorWarnings(pod *v1.Pod) []error {
	var podProfile *v1.AppArmorProfile
	if sc := pod.Spec.SecurityContext; sc != nil {
		podProfile = sc.AppArmorProfile
	}
	var out []error
	for _, key := range slices.Sorted(maps.Keys(pod.Annotations)) {
		name, ok := strings.CutPrefix(key, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix)
		c, _ := podContainer(&pod.Spec, name)
		if !ok || c == nil || c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
			continue
		}
		if p, err := AppArmorAnnotationProfile(pod.Annotations[key]); err != nil || !equality.Semantic.DeepEqual(p, podProfile) {
			out = append(out, &ManifestError{Field: fmt.Sprintf("metadata.annotations[%s]", key),
				Message: `deprecated since v1.30; use the "appArmorProfile" field instead (it still applies to its container here, as on the kubelet v1.37)`})
		}
	}
	return out
}

// AppArmorAnnotationProfile is the field a deprecated AppArmor annotation's
// value stands for, nil for an empty one (which names no profile).
func AppArmorAnnotationProfile(val string) (*v1.AppArmorProfile, error) {
	switch name, local := strings.CutPrefix(val, v1.DeprecatedAppArmorBetaProfileNamePrefix); {
	case val == "":
		return nil, nil
	case val == v1.DeprecatedAppArmorBetaProfileRuntimeDefault:
		return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}, nil
	case val == v1.DeprecatedAppArmorBetaProfileNameUnconfined:
		return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}, nil
	case local && name != "":
		return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}, nil
	}
	return nil, fmt.Errorf("invalid AppArmor profile name: %q", val)
}

// podContainer finds an init or app container by name, with its field path.
func podContainer(spec *v1.PodSpec, name string) (*v1.Container, string) {
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == name {
			return &spec.InitContainers[i], fmt.Sprintf("spec.initContainers[%d]", i)
		}
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i], fmt.Sprintf("spec.containers[%d]", i)
		}
	}
	return nil, ""
}

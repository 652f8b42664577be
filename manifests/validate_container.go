package manifests

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	capability "github.com/containerd/containerd/pkg/cap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/noderun/noderun/internal/admission"
)

// container validates one init or app container. Names must be unique across
// both lists, since they name the containers in one sandbox.
func (v *validator) container(c *v1.Container, field string) {
	v.check(field+".name", validation.IsDNS1123Label(c.Name))
	if v.containers[c.Name] {
		v.add(field+".name", "duplicate container name %q", c.Name)
	}
	v.containers[c.Name] = true
	if strings.TrimSpace(c.Image) == "" {
		v.add(field+".image", "required")
	}
	v.oneOf(field+".imagePullPolicy", string(c.ImagePullPolicy), "Always", "IfNotPresent", "Never")
	v.oneOf(field+".terminationMessagePolicy", string(c.TerminationMessagePolicy), "File", "FallbackToLogsOnError")
	v.ports(c.Ports, field)
	v.env(c, field)
	v.mounts(c, field)
	v.securityContext(c.SecurityContext, field)
	v.extendedResources(c.Resources, field+".resources")
}

// extendedResources applies Kubernetes' rules to extended resources
// (example.com/foo, a device plugin's): a qualified name, whole numbers,
// and, as they cannot be overcommitted, a limit with any request equal to
// it. Defaulting has already made a missing request the limit.
func (v *validator) extendedResources(r v1.ResourceRequirements, field string) {
	for _, list := range []struct {
		name string
		l    v1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range slices.Sorted(maps.Keys(list.l)) {
			if !admission.IsExtendedResource(name) {
				continue
			}
			f, q := fmt.Sprintf("%s.%s[%s]", field, list.name, name), list.l[name]
			limit, hasLimit := r.Limits[name]
			switch {
			case len(validation.IsQualifiedName(string(name))) > 0:
				v.check(f, validation.IsQualifiedName(string(name)))
			case q.MilliValue()%1000 != 0:
				v.add(f, "%s: must be an integer", q.String())
			case list.name == "requests" && !hasLimit:
				v.add(f, "Limit must be set for non overcommitable resources")
			case list.name == "requests" && q.Cmp(limit) != 0:
				v.add(f, "%s: must be equal to %s limit of %s", q.String(), name, limit.String())
			}
		}
	}
}

func (v *validator) ports(ports []v1.ContainerPort, field string) {
	names := map[string]bool{}
	for i, p := range ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		v.check(f+".containerPort", validation.IsValidPortNum(int(p.ContainerPort)))
		if p.HostPort != 0 {
			v.check(f+".hostPort", validation.IsValidPortNum(int(p.HostPort)))
		}
		if v.hostNetwork && p.HostPort != 0 && p.HostPort != p.ContainerPort {
			v.add(f+".hostPort", "must equal containerPort with hostNetwork")
		}
		v.oneOf(f+".protocol", string(p.Protocol), "TCP", "UDP", "SCTP")
		if p.Name != "" {
			v.check(f+".name", validation.IsValidPortName(p.Name))
			if names[p.Name] {
				v.add(f+".name", "duplicate port name %q", p.Name)
			}
			names[p.Name] = true
		}
	}
}

func (v *validator) env(c *v1.Container, field string) {
	for i, e := range c.Env {
		f := fmt.Sprintf("%s.env[%d]", field, i)
		v.check(f+".name", validation.IsRelaxedEnvVarName(e.Name))
		if e.ValueFrom == nil {
			continue
		}
		if e.Value != "" {
			v.add(f+".valueFrom", "may not be set together with value")
		}
		if src := e.ValueFrom; src.FieldRef != nil && !fieldPathOK(src.FieldRef.FieldPath, true) {
			v.add(f+".valueFrom.fieldRef.fieldPath", "unsupported field path %q", src.FieldRef.FieldPath)
		}
		v.keyRef(f+".valueFrom", e.ValueFrom)
		if ref := e.ValueFrom.FileKeyRef; ref != nil {
			v.fileKeyRef(ref, f+".valueFrom.fileKeyRef")
		}
	}
	v.envFrom(c, field)
}

// fileKeyRef applies the API server's rules (validateFileKeySelector and
// validateFileKeyRefVolumes at v1.37): the file is in an emptyDir.
func (v *validator) fileKeyRef(ref *v1.FileKeySelector, f string) {
	if ref.Key == "" {
		v.add(f+".key", "required")
	} else {
		v.check(f+".key", validation.IsRelaxedEnvVarName(ref.Key))
	}
	switch {
	case ref.VolumeName == "":
		v.add(f+".volumeName", "required")
	case !v.volumes[ref.VolumeName]:
		v.add(f+".volumeName", "volume %q is not defined in spec.volumes", ref.VolumeName)
	case !v.emptyDirs[ref.VolumeName]:
		v.add(f+".volumeName", "referenced volume must be of type emptyDir")
	}
	if ref.Path == "" {
		v.add(f+".path", "required")
	} else if hasDotDot(ref.Path) {
		v.add(f+".path", "must not contain '..'")
	}
}

// fieldPathOK accepts the downward API fields the kubelet can resolve; env
// vars can also see spec and status fields.
func fieldPathOK(p string, env bool) bool {
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if strings.HasPrefix(p, prefix) && strings.HasSuffix(p, "']") {
			return true
		}
	}
	switch p {
	case "metadata.name", "metadata.namespace", "metadata.uid":
		return true
	case "metadata.labels", "metadata.annotations":
		return !env
	case "spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs":
		return env
	}
	return false
}

// recursiveReadOnly applies the API server's rules (validateMountRecursiveReadOnly
// at v1.37).
func (v *validator) recursiveReadOnly(m v1.VolumeMount, f string) {
	if m.RecursiveReadOnly == nil {
		return
	}
	switch *m.RecursiveReadOnly {
	case v1.RecursiveReadOnlyDisabled:
		return
	case v1.RecursiveReadOnlyEnabled, v1.RecursiveReadOnlyIfPossible:
	default:
		v.add(f, "unsupported value %q: supported values: Disabled, Enabled, IfPossible", *m.RecursiveReadOnly)
		return
	}
	if !m.ReadOnly {
		v.add(f, "may only be specified when readOnly is true")
	}
	if m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone {
		v.add(f, "may only be specified when mountPropagation is None or not specified")
	}
}

func (v *validator) mounts(c *v1.Container, field string) {
	paths := map[string]bool{}
	for i, m := range c.VolumeMounts {
		f := fmt.Sprintf("%s.volumeMounts[%d]", field, i)
		v.recursiveReadOnly(m, f+".recursiveReadOnly")
		if !v.volumes[m.Name] {
			v.add(f+".name", "volume %q is not defined in spec.volumes", m.Name)
		}
		if m.MountPath == "" {
			v.add(f+".mountPath", "required")
		} else if paths[m.MountPath] {
			v.add(f+".mountPath", "%q is mounted more than once", m.MountPath)
		}
		paths[m.MountPath] = true
		if m.SubPath != "" && m.SubPathExpr != "" {
			v.add(f+".subPathExpr", "subPathExpr and subPath are mutually exclusive")
		}
		for _, sp := range []struct{ name, value string }{{"subPath", m.SubPath}, {"subPathExpr", m.SubPathExpr}} {
			if sp.value != "" && (path.IsAbs(sp.value) || hasDotDot(sp.value)) {
				v.add(f+"."+sp.name, "must be a relative path without '..'")
			}
		}
		if m.MountPropagation != nil {
			v.oneOf(f+".mountPropagation", string(*m.MountPropagation), "None", "HostToContainer", "Bidirectional")
			privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
			if *m.MountPropagation == v1.MountPropagationBidirectional && !privileged {
				v.add(f+".mountPropagation", "Bidirectional mount propagation is available only to privileged containers")
			}
		}
	}
}

// securityContext applies Kubernetes' rules for a container's
// securityContext. Unmasked /proc is valid only with hostUsers: false (a
// user namespace of the pod's own).
func (v *validator) securityContext(sc *v1.SecurityContext, field string) {
	if sc == nil {
		return
	}
	field += ".securityContext"
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		if sc.Privileged != nil && *sc.Privileged {
			v.add(field, "cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
		}
		if sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "CAP_SYS_ADMIN") {
			v.add(field, "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN")
		}
	}
	if c := sc.Capabilities; c != nil {
		v.capabilities(c.Add, field+".capabilities.add")
		v.capabilities(c.Drop, field+".capabilities.drop")
	}
	if sc.ProcMount != nil {
		v.oneOf(field+".procMount", string(*sc.ProcMount), "Default", "Unmasked")
		if *sc.ProcMount == v1.UnmaskedProcMount && !v.userNS {
			v.add(field+".procMount", "Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`")
		}
	}
	v.seccompProfile(sc.SeccompProfile, field+".seccompProfile")
	v.appArmorProfile(sc.AppArmorProfile, field+".appArmorProfile")
}

// capabilities refuses names the kernel does not know: runc would skip them
// with only a warning, so a typo in drop would leave the capability granted.
// Both NET_ADMIN and CAP_NET_ADMIN spellings and ALL are accepted.
func (v *validator) capabilities(caps []v1.Capability, field string) {
	for i, c := range caps {
		n := strings.ToUpper(string(c))
		if n != "ALL" && !slices.Contains(capability.Known(), "CAP_"+strings.TrimPrefix(n, "CAP_")) {
			v.add(fmt.Sprintf("%s[%d]", field, i), "unknown capability %q", c)
		}
	}
}

// seccompProfile: Localhost names a file under <state-dir>/seccomp by a
// relative path that cannot climb out of it.
func (v *validator) seccompProfile(p *v1.SeccompProfile, field string) {
	if p == nil {
		return
	}
	v.profileType(field, string(p.Type), p.LocalhostProfile)
	if p.Type == v1.SeccompProfileTypeLocalhost && p.LocalhostProfile != nil {
		lp := *p.LocalhostProfile
		if path.IsAbs(lp) || slices.Contains(strings.Split(lp, "/"), "..") {
			v.add(field+".localhostProfile", "must be a relative path without '..'")
		}
	}
}

func (v *validator) appArmorProfile(p *v1.AppArmorProfile, field string) {
	if p != nil {
		v.profileType(field, string(p.Type), p.LocalhostProfile)
	}
}

// profileType checks a seccomp or AppArmor profile's type and that
// localhostProfile is set exactly when the type is Localhost.
func (v *validator) profileType(field, typ string, localhost *string) {
	if typ == "" {
		v.add(field+".type", "required")
	}
	v.oneOf(field+".type", typ, "RuntimeDefault", "Unconfined", "Localhost")
	switch {
	case typ == "Localhost" && (localhost == nil || *localhost == ""):
		v.add(field+".localhostProfile", "required when type is Localhost")
	case typ != "Localhost" && localhost != nil:
		v.add(field+".localhostProfile", "may only be set when type is Localhost")
	}
}

// podResources is the API server's validatePodResources for what noderun
// accepts there (cpu and memory): quantities not negative, each request
// at most its limit, each pod-level request at least the containers'
// aggregate (init containers as the kubelet counts them), and each app
// container's limit at most the pod's.
func (v *validator) podResources(spec *v1.PodSpec) {
	r := spec.Resources
	if r == nil {
		return
	}
	const field = "spec.resources"
	for _, list := range []struct {
		name string
		l    v1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range slices.Sorted(maps.Keys(list.l)) {
			if q := list.l[name]; q.Sign() < 0 {
				v.add(fmt.Sprintf("%s.%s[%s]", field, list.name, name), "%s: must be greater than or equal to 0", q.String())
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(r.Requests)) {
		req := r.Requests[name]
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			v.add(field+".requests", "%s: must be less than or equal to %s limit of %s", req.String(), name, lim.String())
		}
	}
	aggr := resourcehelper.AggregateContainerRequests(&v1.Pod{Spec: *spec}, resourcehelper.PodResourcesOptions{})
	for _, name := range slices.Sorted(maps.Keys(aggr)) {
		q := aggr[name]
		if req, ok := r.Requests[name]; ok && q.Cmp(req) > 0 {
			v.add(fmt.Sprintf("%s.requests[%s]", field, name), "%s: must be greater than or equal to aggregate container requests of %s", req.String(), q.String())
		}
	}
	for i, c := range spec.Containers {
		for _, name := range slices.Sorted(maps.Keys(c.Resources.Limits)) {
			q := c.Resources.Limits[name]
			if lim, ok := r.Limits[name]; ok && q.Cmp(lim) > 0 {
				// The API server's path, as it words it.
				v.add(fmt.Sprintf("%s.containers[%d][%s].limits", field, i, name), "%s: must be less than or equal to pod limits of %s", q.String(), lim.String())
			}
		}
	}
}

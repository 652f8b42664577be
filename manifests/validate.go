package manifests

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/noderun/noderun/internal/bandwidth"
)

// validator collects ManifestErrors; each check adds to it and goes on, so
// one pass reports every problem.
type validator struct {
	errs        []error
	volumes     map[string]bool // names in spec.volumes
	emptyDirs   map[string]bool // names of emptyDir volumes
	containers  map[string]bool // names across init and app containers
	hostNetwork bool
	userNS      bool // hostUsers: false
}

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &ManifestError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// check adds the messages apimachinery's validation functions return.
func (v *validator) check(field string, msgs []string) {
	if len(msgs) > 0 {
		v.add(field, "%s", strings.Join(msgs, "; "))
	}
}

// Validate applies the Kubernetes rules that matter for what noderun runs
// (checkFields, not this, refuses what references API objects). Empty enum
// fields pass, since ApplyDefaults fills them. Errors are *ManifestError with
// Field set.
func Validate(pod *v1.Pod) []error {
	v := &validator{containers: map[string]bool{}, volumes: map[string]bool{}, emptyDirs: map[string]bool{}, hostNetwork: pod.Spec.HostNetwork,
		userNS: pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers}
	v.metadata(pod)
	v.appArmorAnnotations(pod)
	v.waitFor(pod)
	v.rollbackAfter(pod)
	v.spec(&pod.Spec)
	if sc := pod.Spec.SecurityContext; sc != nil {
		v.seccompProfile(sc.SeccompProfile, "spec.securityContext.seccompProfile")
		v.appArmorProfile(sc.AppArmorProfile, "spec.securityContext.appArmorProfile")
	}
	for i := range pod.Spec.Volumes {
		v.volume(&pod.Spec.Volumes[i], fmt.Sprintf("spec.volumes[%d]", i))
	}
	for i := range pod.Spec.InitContainers {
		v.container(&pod.Spec.InitContainers[i], fmt.Sprintf("spec.initContainers[%d]", i))
		v.lifecycle(&pod.Spec.InitContainers[i], fmt.Sprintf("spec.initContainers[%d]", i), true, grace(pod))
	}
	for i := range pod.Spec.Containers {
		v.container(&pod.Spec.Containers[i], fmt.Sprintf("spec.containers[%d]", i))
		v.lifecycle(&pod.Spec.Containers[i], fmt.Sprintf("spec.containers[%d]", i), false, grace(pod))
	}
	return v.errs
}

func (v *validator) metadata(pod *v1.Pod) {
	if pod.Name == "" {
		v.add("metadata.name", "required")
	} else {
		v.check("metadata.name", validation.IsDNS1123Subdomain(pod.Name))
	}
	if pod.Namespace != "" {
		v.check("metadata.namespace", validation.IsDNS1123Label(pod.Namespace))
	}
	if pod.UID != "" {
		if err := CheckUID(string(pod.UID)); err != nil {
			v.add("metadata.uid", "%v", err)
		}
	}
	// Checked here too, not only when the pod's network is attached.
	for _, key := range []string{bandwidth.IngressAnnotation, bandwidth.EgressAnnotation} {
		if val, ok := pod.Annotations[key]; ok {
			if _, err := bandwidth.ParseRate(val); err != nil {
				v.add(fmt.Sprintf("metadata.annotations[%s]", key), "%v", err)
			}
		}
	}
}

func (v *validator) spec(spec *v1.PodSpec) {
	if len(spec.Containers) == 0 {
		v.add("spec.containers", "at least one container is required")
	}
	v.oneOf("spec.restartPolicy", string(spec.RestartPolicy), "Always", "OnFailure", "Never")
	v.oneOf("spec.dnsPolicy", string(spec.DNSPolicy), "ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")
	v.names(spec)
	v.podResources(spec)
	if spec.HostPID && spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		v.add("spec.shareProcessNamespace", "ShareProcessNamespace and HostPID cannot both be enabled")
	}
	if sc := spec.SecurityContext; sc != nil {
		v.sysctls(sc.Sysctls, spec.HostNetwork, spec.HostIPC)
	}
	v.hostUsers(spec)
	if spec.DNSPolicy == v1.DNSNone && (spec.DNSConfig == nil || len(spec.DNSConfig.Nameservers) == 0) {
		v.add("spec.dnsConfig.nameservers", "required when dnsPolicy is None")
	}
}

// hostUsers applies the API server's rules for a pod in a user namespace
// of its own: none of the host's namespaces. noderun also refuses
// shareProcessNamespace there: the process that holds a pod's PID namespace
// (runner/sandbox's pause) is started in the host's user namespace, and a
// PID namespace it makes would not be the pod's to mount /proc for.
func (v *validator) hostUsers(spec *v1.PodSpec) {
	if !v.userNS {
		return
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"spec.hostNetwork", spec.HostNetwork}, {"spec.hostPID", spec.HostPID}, {"spec.hostIPC", spec.HostIPC}} {
		if f.set {
			v.add(f.name, "Forbidden: when `pod.Spec.HostUsers` is false")
		}
	}
	if spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		v.add("spec.shareProcessNamespace", "noderun cannot share one PID namespace among a pod's containers in its own user namespace (hostUsers: false)")
	}
}

// oneOf accepts value if it is empty (to be defaulted) or one of allowed.
func (v *validator) oneOf(field, value string, allowed ...string) {
	if value == "" {
		return
	}
	for _, a := range allowed {
		if value == a {
			return
		}
	}
	v.add(field, "unsupported value %q: supported values: %s", value, strings.Join(allowed, ", "))
}

// enum is oneOf for a field that has no default: empty is refused too.
func (v *validator) enum(field, value string, allowed ...string) {
	if value == "" {
		v.add(field, "unsupported value \"\": supported values: %s", strings.Join(allowed, ", "))
		return
	}
	v.oneOf(field, value, allowed...)
}

func (v *validator) volume(vol *v1.Volume, field string) {
	v.check(field+".name", validation.IsDNS1123Label(vol.Name))
	if v.volumes[vol.Name] {
		v.add(field+".name", "duplicate volume name %q", vol.Name)
	}
	v.volumes[vol.Name] = true
	v.emptyDirs[vol.Name] = vol.EmptyDir != nil
	v.volumeSource(field, &vol.VolumeSource)
}

func (v *validator) volumeSource(field string, src *v1.VolumeSource) {
	switch kinds := volumeKinds(src); {
	case len(kinds) == 0:
		v.add(field, "a volume type is required (emptyDir, hostPath or downwardAPI)")
	case len(kinds) > 1:
		v.add(field, "only one volume type may be set, found %s", strings.Join(kinds, ", "))
	case src.HostPath != nil:
		v.hostPath(field+".hostPath", src.HostPath)
	case src.DownwardAPI != nil:
		v.downwardAPI(field+".downwardAPI", src.DownwardAPI)
	case src.ConfigMap != nil:
		v.configMapVolume(field+".configMap", src.ConfigMap)
	case src.Secret != nil:
		v.secretVolume(field+".secret", src.Secret)
	case src.Projected != nil:
		v.projected(field+".projected", src.Projected)
	case src.Image != nil:
		v.imageVolume(field+".image", src.Image)
	case src.EmptyDir != nil:
		// Nothing to check: any medium and size limit is fine.
	}
}

// volumeKinds names the volume types set in src, by their JSON field names.
func volumeKinds(src *v1.VolumeSource) []string {
	set := []struct {
		name string
		ok   bool
	}{
		{"hostPath", src.HostPath != nil}, {"emptyDir", src.EmptyDir != nil},
		{"downwardAPI", src.DownwardAPI != nil}, {"secret", src.Secret != nil},
		{"configMap", src.ConfigMap != nil}, {"persistentVolumeClaim", src.PersistentVolumeClaim != nil},
		{"projected", src.Projected != nil}, {"csi", src.CSI != nil},
		{"ephemeral", src.Ephemeral != nil}, {"image", src.Image != nil},
		{"nfs", src.NFS != nil}, {"iscsi", src.ISCSI != nil},
		{"gitRepo", src.GitRepo != nil}, {"fc", src.FC != nil},
		{"rbd", src.RBD != nil}, {"cephfs", src.CephFS != nil},
	}
	var kinds []string
	for _, s := range set {
		if s.ok {
			kinds = append(kinds, s.name)
		}
	}
	return kinds
}

// imageVolume applies the API server's rules (validateImageVolumeSource at
// v1.37), in its words.
func (v *validator) imageVolume(field string, img *v1.ImageVolumeSource) {
	if img.Reference == "" {
		v.add(field+".reference", "Required value")
	}
	v.enum(field+".pullPolicy", string(img.PullPolicy), "Always", "IfNotPresent", "Never")
}

func (v *validator) hostPath(field string, hp *v1.HostPathVolumeSource) {
	if !path.IsAbs(hp.Path) {
		v.add(field+".path", "must be an absolute path")
	}
	if hp.Type != nil {
		v.oneOf(field+".type", string(*hp.Type), "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")
	}
}

func (v *validator) downwardAPI(field string, d *v1.DownwardAPIVolumeSource) {
	v.fileMode(field+".defaultMode", d.DefaultMode)
	for i, item := range d.Items {
		f := fmt.Sprintf("%s.items[%d]", field, i)
		v.itemPath(f+".path", item.Path)
		v.fileMode(f+".mode", item.Mode)
		if (item.FieldRef == nil) == (item.ResourceFieldRef == nil) {
			v.add(f, "exactly one of fieldRef and resourceFieldRef is required")
		} else if item.FieldRef != nil && !fieldPathOK(item.FieldRef.FieldPath, false) {
			v.add(f+".fieldRef.fieldPath", "unsupported field path %q", item.FieldRef.FieldPath)
		}
	}
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

// hostnameOverride applies the API server's rules (validatePodHostName at
// v1.37).
func (v *validator) hostnameOverride(spec *v1.PodSpec) {
	o := spec.HostnameOverride
	if o == nil {
		return
	}
	const f = "spec.hostnameOverride"
	if spec.SetHostnameAsFQDN != nil && *spec.SetHostnameAsFQDN {
		v.add(f, "may not be specified when setHostnameAsFQDN is true")
	}
	if spec.HostNetwork {
		v.add(f, "may not be specified when hostNetwork is true")
	}
	if len(*o) > 64 {
		v.add(f, "may not be more than 64 bytes")
	}
	v.check(f, validation.IsDNS1123Subdomain(*o))
}

// names checks what noderun writes into the pod's /etc/hosts, /etc/hostname
// and resolv.conf as Kubernetes validates it, so no value can add lines.
func (v *validator) names(spec *v1.PodSpec) {
	if spec.Hostname != "" {
		v.check("spec.hostname", validation.IsDNS1123Label(spec.Hostname))
	}
	if spec.Subdomain != "" {
		v.check("spec.subdomain", validation.IsDNS1123Label(spec.Subdomain))
	}
	v.hostnameOverride(spec)
	for i, a := range spec.HostAliases {
		f := fmt.Sprintf("spec.hostAliases[%d]", i)
		v.ip(f+".ip", a.IP)
		for j, h := range a.Hostnames {
			v.check(fmt.Sprintf("%s.hostnames[%d]", f, j), validation.IsDNS1123Subdomain(h))
		}
	}
	d := spec.DNSConfig
	if d == nil {
		return
	}
	if len(d.Nameservers) > 3 {
		v.add("spec.dnsConfig.nameservers", "must not have more than 3 nameservers")
	}
	for i, ns := range d.Nameservers {
		v.ip(fmt.Sprintf("spec.dnsConfig.nameservers[%d]", i), ns)
	}
	if len(d.Searches) > 32 {
		v.add("spec.dnsConfig.searches", "must not have more than 32 search paths")
	}
	if n := len(strings.Join(d.Searches, " ")); n > 2048 {
		v.add("spec.dnsConfig.searches", "must not have more than 2048 characters (including spaces), have %d", n)
	}
	// As the API server's relaxed search validation (on by default since
	// Kubernetes 1.33): "." (no search) and underscores, as in SRV names.
	for i, s := range d.Searches {
		if s != "." {
			v.check(fmt.Sprintf("spec.dnsConfig.searches[%d]", i), validation.IsDNS1123SubdomainWithUnderscore(strings.TrimSuffix(s, ".")))
		}
	}
	// The API server asks only for a name; white space would add a line or
	// an option to resolv.conf.
	for i, o := range d.Options {
		f := fmt.Sprintf("spec.dnsConfig.options[%d]", i)
		if o.Name == "" || strings.ContainsAny(o.Name, " \t\r\n:") {
			v.add(f+".name", "must be a non-empty word")
		}
		if o.Value != nil && strings.ContainsAny(*o.Value, " \t\r\n") {
			v.add(f+".value", "must not contain white space")
		}
	}
}

// ip checks an address as the API server does with StrictIPCIDRValidation:
// no leading zeros, which libc reads as octal, and no IPv4-mapped IPv6.
func (v *validator) ip(f, value string) {
	for _, e := range validation.IsValidIPForLegacyField(field.NewPath(f), value, true, nil) {
		v.add(f, "%s", e.ErrorBody())
	}
}

var sysctlName = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$`)

// sysctls applies Kubernetes' rules: valid unique names, and only sysctls
// of the pod's own namespaces (net.* unless hostNetwork, the IPC ones unless
// hostIPC); a node-wide sysctl would change the host. Whether a namespaced
// one is allowed (safe, or --allowed-unsafe-sysctls) is the node's call.
func (v *validator) sysctls(list []v1.Sysctl, hostNetwork, hostIPC bool) {
	seen := map[string]bool{}
	for i, s := range list {
		f := fmt.Sprintf("spec.securityContext.sysctls[%d].name", i)
		name := SysctlName(s.Name)
		switch {
		case !sysctlName.MatchString(s.Name) || len(s.Name) > 253:
			v.add(f, "%q is not a valid sysctl name", s.Name)
		case seen[name]:
			v.add(f, "duplicate sysctl %q", s.Name)
		case strings.HasPrefix(name, "net."):
			if hostNetwork {
				v.add(f, "%q cannot be set with hostNetwork: it would change the host's network namespace", s.Name)
			}
		case ipcSysctl(name):
			if hostIPC {
				v.add(f, "%q cannot be set with hostIPC: it would change the host's IPC namespace", s.Name)
			}
		default:
			v.add(f, "%q is not namespaced: it would change the whole node", s.Name)
		}
		seen[name] = true
	}
}

func ipcSysctl(name string) bool {
	return name == "kernel.sem" || strings.HasPrefix(name, "kernel.shm") || strings.HasPrefix(name, "kernel.msg") || strings.HasPrefix(name, "fs.mqueue.")
}

// SysctlName gives a sysctl in dotted form: Kubernetes also takes
// "net/ipv4/conf/eth0.100/rp_filter", where dots and slashes swap roles.
func SysctlName(name string) string {
	if !strings.Contains(name, "/") {
		return name
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '/':
			return '.'
		case '.':
			return '/'
		}
		return r
	}, name)
}

// grace is the pod's terminationGracePeriodSeconds, defaulted.
func grace(pod *v1.Pod) int64 {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return *g
	}
	return v1.DefaultTerminationGracePeriodSeconds
}

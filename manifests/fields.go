package manifests

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/internal/admission"
)

// FieldStatus says what noderun does with a Pod field.
type FieldStatus string

// The three lists every Pod field is in.
const (
	Works   FieldStatus = "works"   // as in Kubernetes
	Refused FieldStatus = "refused" // a pod setting it is an error
	Ignored FieldStatus = "ignored" // accepted, does nothing here on purpose: a warning
	// OptIn: works with --local-config-objects (ConfigMap and Secret
	// documents in the manifest sources); refused without it, as the
	// kubelet refuses API references in static pods.
	OptIn FieldStatus = "opt-in"
)

// fieldRule classifies one field. Paths start at the Pod ("spec.",
// "metadata."); fields of init and app containers are listed once under
// "container.". A Works
// field's own fields are classified too; a Refused or Ignored field covers
// everything below it. accept, when set, narrows a Refused field: values it
// accepts work, others are refused.
type fieldRule struct {
	path   string
	status FieldStatus
	reason string
	accept func(reflect.Value) bool
	// refers, on an OptIn field, names the API resource a value
	// references as the kubelet words it (referredResource when unset).
	refers func(reflect.Value) string
}

// Reasons of fields Kubernetes v1.37 gates off by default
// (pkg/features/kube_features.go at v1.37.2): its API server drops them and
// its kubelet does not act on them, so a pod that relies on one is refused
// rather than run without it.
var (
	whyH2CProbe  = alpha("H2CContainerProbe") + "; probes and hooks speak plain HTTP/1.1"
	whyTLSProbe  = alpha("GRPCContainerProbeTLS") + "; gRPC probes are plaintext"
	whyUserField = alpha("AtomicWriteVolumeUserFields")
)

// alpha is the reason of a field behind an alpha feature gate.
func alpha(gate string) string {
	return "alpha in Kubernetes v1.37 (the " + gate + " feature gate, off by default)"
}

// StaticPodReference is the kubelet v1.37's refusal of a static pod that
// references API objects (pkg/kubelet/config/common.go; the API server's
// NodeRestriction refuses such a mirror pod too): resource is named as the
// kubelet names it, e.g. "secrets (via secret volumes)". Every such refusal
// goes through here.
func StaticPodReference(resource string) string {
	return "static pods may not reference " + resource + ", as in Kubernetes v1.37 (there is no API server to read them from)"
}

// Reasons shared by several fields.
const (
	whyAPIServer  = "needs an API server (its content or its effect lives in API objects)"
	whyScheduling = "scheduling only: there is one node and no scheduler"
	whySELinux    = "this node has no SELinux; the kubelet with containerd ignores it there too"
	whyWindows    = "Linux node: the kubelet ignores Windows options on Linux"
	whyNotHere    = "not implemented by noderun"
	whyResources  = "cpu and memory are enforced and admitted against the node; extended resources (example.com/foo) are admitted without a device, as by the kubelet with no device plugin registered; others (ephemeral-storage, hugepages) are not supported"
	whyAdmission  = "admitted against the node's labels (the kubelet's well-known ones and --node-labels): a pod they do not match is rejected, phase Failed, reason NodeAffinity, as by the kubelet"
	whyPodAffin   = "scheduling only: the kubelet does not check it at admission either"
	whyLocalCfg   = "with --local-config-objects: read from ConfigMap and Secret documents of the pod's namespace in the manifest sources; without it refused, as the kubelet refuses static pods that reference API objects"
	whyPodLevel   = "pod-level resources are cpu and memory; Kubernetes also takes hugepages there, which noderun does not support"
	whyServerSets = "set by the API server, which ignores a value in what it is given; noderun's API reports its own"
)

var fieldRules = []fieldRule{
	{path: "kind", status: Works, reason: "Pod, or PodList with the pods in items"},
	{path: "apiVersion", status: Works, reason: "v1"},
	{path: "metadata", status: Works},
	{path: "metadata.name", status: Works},
	{path: "metadata.generateName", status: Refused, reason: "static pods need a fixed metadata.name"},
	{path: "metadata.namespace", status: Works, reason: "default when unset"},
	{path: "metadata.selfLink", status: Ignored, reason: "no longer set by Kubernetes (since 1.20)"},
	{path: "metadata.uid", status: Works, reason: "when unset, a hash of the source and the manifest, as the kubelet makes for static pods"},
	{path: "metadata.resourceVersion", status: Ignored, reason: whyServerSets},
	{path: "metadata.generation", status: Ignored, reason: "set by noderun as by the API server, which ignores a value in what it is given: 1 when the pod appears, one more at each change of its spec (an edit that keeps metadata.uid); status.observedGeneration and each condition's follow it, as the kubelet v1.37 reports them"},
	{path: "metadata.creationTimestamp", status: Ignored, reason: whyServerSets},
	{path: "metadata.deletionTimestamp", status: Ignored, reason: whyServerSets},
	{path: "metadata.deletionGracePeriodSeconds", status: Ignored, reason: whyServerSets},
	{path: "metadata.labels", status: Works},
	{path: "metadata.annotations", status: Works, reason: "noderun's own are under noderun.dev/ (docs/pods.md); the deprecated container.apparmor.security.beta.kubernetes.io/<container> applies to its container ahead of the pod's field, validated and warned of, as for the kubelet v1.37's static pods"},
	{path: "metadata.ownerReferences", status: Ignored, reason: "no garbage collector on a standalone node; a pod lives as long as its manifest"},
	{path: "metadata.finalizers", status: Ignored, reason: "no API server deletes objects here; a pod goes when its manifest does"},
	{path: "metadata.managedFields", status: Ignored, reason: "server-side apply's bookkeeping: " + whyServerSets},
	{path: "status", status: Ignored, reason: "a pod's status is what noderun reports; a manifest's is not read, as by the kubelet"},
	{path: "spec", status: Works},
	{path: "spec.volumes", status: Works},
	{path: "spec.volumes[].name", status: Works},
	{path: "spec.volumes[].hostPath", status: Works},
	{path: "spec.volumes[].hostPath.path", status: Works},
	{path: "spec.volumes[].hostPath.type", status: Works},
	{path: "spec.volumes[].emptyDir", status: Works},
	{path: "spec.volumes[].emptyDir.medium", status: Works},
	{path: "spec.volumes[].emptyDir.sizeLimit", status: Works, reason: "the size of a Memory emptyDir's tmpfs; a disk emptyDir is not measured"},
	{path: "spec.volumes[].emptyDir.mode", status: Refused, reason: alpha("EmptyDirVolumeMode")},
	{path: "spec.volumes[].downwardAPI", status: Works, reason: "mounted read-only, written atomically (..data swap)"},
	{path: "spec.volumes[].downwardAPI.items", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].path", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].fieldRef", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].fieldRef.apiVersion", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].fieldRef.fieldPath", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].resourceFieldRef", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].resourceFieldRef.containerName", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].resourceFieldRef.resource", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].resourceFieldRef.divisor", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].mode", status: Works},
	{path: "spec.volumes[].downwardAPI.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].downwardAPI.defaultMode", status: Works},
	{path: "spec.volumes[].downwardAPI.defaultUser", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].secret", status: OptIn, refers: via("secrets (via secret volumes)"), reason: whyLocalCfg + "; on a tmpfs of its own, mounted read-only, updated atomically (..data swap) when the document changes"},
	{path: "spec.volumes[].secret.secretName", status: Works},
	{path: "spec.volumes[].secret.items", status: Works},
	{path: "spec.volumes[].secret.items[].key", status: Works},
	{path: "spec.volumes[].secret.items[].path", status: Works},
	{path: "spec.volumes[].secret.items[].mode", status: Works},
	{path: "spec.volumes[].secret.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].secret.defaultMode", status: Works},
	{path: "spec.volumes[].secret.optional", status: Works},
	{path: "spec.volumes[].secret.defaultUser", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].configMap", status: OptIn, refers: via("configmaps (via configmap volumes)"), reason: whyLocalCfg + "; mounted read-only, updated atomically (..data swap) when the document changes"},
	{path: "spec.volumes[].configMap.name", status: Works},
	{path: "spec.volumes[].configMap.items", status: Works},
	{path: "spec.volumes[].configMap.items[].key", status: Works},
	{path: "spec.volumes[].configMap.items[].path", status: Works},
	{path: "spec.volumes[].configMap.items[].mode", status: Works},
	{path: "spec.volumes[].configMap.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].configMap.defaultMode", status: Works},
	{path: "spec.volumes[].configMap.optional", status: Works},
	{path: "spec.volumes[].configMap.defaultUser", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].projected", status: OptIn, refers: projectedReference, reason: whyLocalCfg + "; configMap, secret and downwardAPI sources, on a tmpfs of its own, mounted read-only, updated atomically"},
	{path: "spec.volumes[].projected.sources", status: Works},
	{path: "spec.volumes[].projected.sources[].secret", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.name", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.items", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.items[].key", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.items[].path", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.items[].mode", status: Works},
	{path: "spec.volumes[].projected.sources[].secret.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].projected.sources[].secret.optional", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.name", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.items", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.items[].key", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.items[].path", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.items[].mode", status: Works},
	{path: "spec.volumes[].projected.sources[].configMap.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].projected.sources[].configMap.optional", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].path", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].fieldRef", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].fieldRef.apiVersion", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].fieldRef.fieldPath", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].resourceFieldRef", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].resourceFieldRef.containerName", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].resourceFieldRef.resource", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].resourceFieldRef.divisor", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].mode", status: Works},
	{path: "spec.volumes[].projected.sources[].downwardAPI.items[].user", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].projected.sources[].serviceAccountToken", status: Refused, reason: StaticPodReference("serviceaccounts (via projected volumes)")},
	{path: "spec.volumes[].projected.sources[].clusterTrustBundle", status: Refused, reason: StaticPodReference("clustertrustbundles")},
	{path: "spec.volumes[].projected.sources[].podCertificate", status: Refused, reason: StaticPodReference("podcertificates")},
	{path: "spec.volumes[].projected.defaultMode", status: Works},
	{path: "spec.volumes[].projected.defaultUser", status: Refused, reason: whyUserField},
	{path: "spec.volumes[].persistentVolumeClaim", status: Refused, reason: StaticPodReference("persistentvolumeclaims")},
	{path: "spec.volumes[].ephemeral", status: Refused, reason: StaticPodReference("persistentvolumeclaims (via ephemeral volumes)")},
	{path: "spec.volumes[].csi", status: Refused, reason: StaticPodReference("csidrivers (via CSI volumes)")},
	{path: "spec.volumes[].image", status: Works},
	{path: "spec.volumes[].image.reference", status: Works},
	{path: "spec.volumes[].image.pullPolicy", status: Works},
	{path: "spec.volumes[].gitRepo", status: Refused, reason: "disabled in Kubernetes v1.37 (the deprecated GitRepoVolumeDriver feature gate, off by default); use an init container"},
	{path: "spec.volumes[].nfs", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].iscsi", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].glusterfs", status: Refused, reason: StaticPodReference("endpoints (via glusterFS volumes)")},
	{path: "spec.volumes[].rbd", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].cephfs", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].fc", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].flexVolume", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].flocker", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].cinder", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].gcePersistentDisk", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].awsElasticBlockStore", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].azureFile", status: Refused, reason: StaticPodReference("secrets (via azureFile volumes)")},
	{path: "spec.volumes[].azureDisk", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].vsphereVolume", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].quobyte", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].photonPersistentDisk", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].portworxVolume", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].scaleIO", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},
	{path: "spec.volumes[].storageos", status: Refused, reason: "network and cloud volume plugins are not part of noderun"},

	{path: "spec.initContainers", status: Works, reason: "run in order before the app containers"},
	{path: "spec.containers", status: Works},
	{path: "container.name", status: Works},
	{path: "container.image", status: Works},
	{path: "container.command", status: Works},
	{path: "container.args", status: Works},
	{path: "container.workingDir", status: Works},
	{path: "container.ports", status: Works},
	{path: "container.ports[].name", status: Works},
	{path: "container.ports[].hostPort", status: Works},
	{path: "container.ports[].containerPort", status: Works},
	{path: "container.ports[].protocol", status: Works},
	{path: "container.ports[].hostIP", status: Works},
	{path: "container.envFrom", status: OptIn, reason: whyLocalCfg + "; read at each container start"},
	{path: "container.envFrom[].prefix", status: Works},
	{path: "container.envFrom[].configMapRef", status: Works},
	{path: "container.envFrom[].configMapRef.name", status: Works},
	{path: "container.envFrom[].configMapRef.optional", status: Works},
	{path: "container.envFrom[].secretRef", status: Works},
	{path: "container.envFrom[].secretRef.name", status: Works},
	{path: "container.envFrom[].secretRef.optional", status: Works},
	{path: "container.env", status: Works},
	{path: "container.env[].name", status: Works},
	{path: "container.env[].value", status: Works, reason: "with $(VAR) expansion"},
	{path: "container.env[].valueFrom", status: Works},
	{path: "container.env[].valueFrom.fieldRef", status: Works},
	{path: "container.env[].valueFrom.fieldRef.apiVersion", status: Works},
	{path: "container.env[].valueFrom.fieldRef.fieldPath", status: Works},
	{path: "container.env[].valueFrom.resourceFieldRef", status: Works},
	{path: "container.env[].valueFrom.resourceFieldRef.containerName", status: Works},
	{path: "container.env[].valueFrom.resourceFieldRef.resource", status: Works},
	{path: "container.env[].valueFrom.resourceFieldRef.divisor", status: Works},
	{path: "container.env[].valueFrom.configMapKeyRef", status: OptIn, reason: whyLocalCfg + "; read at each container start"},
	{path: "container.env[].valueFrom.configMapKeyRef.name", status: Works},
	{path: "container.env[].valueFrom.configMapKeyRef.key", status: Works},
	{path: "container.env[].valueFrom.configMapKeyRef.optional", status: Works},
	{path: "container.env[].valueFrom.secretKeyRef", status: OptIn, reason: whyLocalCfg + "; read at each container start"},
	{path: "container.env[].valueFrom.secretKeyRef.name", status: Works},
	{path: "container.env[].valueFrom.secretKeyRef.key", status: Works},
	{path: "container.env[].valueFrom.secretKeyRef.optional", status: Works},
	{path: "container.env[].valueFrom.fileKeyRef", status: Works, reason: "KEY='value' read from a file in an emptyDir when the container starts (after init containers), as the kubelet v1.37 parses it"},
	{path: "container.env[].valueFrom.fileKeyRef.volumeName", status: Works},
	{path: "container.env[].valueFrom.fileKeyRef.path", status: Works},
	{path: "container.env[].valueFrom.fileKeyRef.key", status: Works},
	{path: "container.env[].valueFrom.fileKeyRef.optional", status: Works},
	{path: "container.resources", status: Works},
	{path: "container.resources.limits", status: Refused, reason: whyResources, accept: cpuMemoryOrExtended},
	{path: "container.resources.requests", status: Refused, reason: whyResources, accept: cpuMemoryOrExtended},
	{path: "container.resources.claims", status: Refused, reason: StaticPodReference("resourceclaims")},
	{path: "container.resizePolicy", status: Ignored, reason: "resizing a running pod needs an API server; a new manifest replaces the pod"},
	{path: "container.restartPolicy", status: Works, reason: "Always on an init container makes it a sidecar; otherwise (Always, OnFailure, Never) it overrides the pod's restartPolicy for that container (ContainerRestartRules, beta and on in Kubernetes v1.37)"},
	{path: "container.restartPolicyRules", status: Works, reason: "evaluated in order on each exit, before the container's restartPolicy, as the kubelet v1.37 does"},
	{path: "container.restartPolicyRules[].action", status: Works, reason: "Restart restarts the container; RestartAllContainers (beta and on in Kubernetes v1.37) stops every container, removes them and starts the pod over from its first init container in the same sandbox, keeping its IP"},
	{path: "container.restartPolicyRules[].exitCodes", status: Works},
	{path: "container.restartPolicyRules[].exitCodes.operator", status: Works},
	{path: "container.restartPolicyRules[].exitCodes.values", status: Works},
	{path: "container.volumeMounts", status: Works},
	{path: "container.volumeMounts[].name", status: Works},
	{path: "container.volumeMounts[].readOnly", status: Works},
	{path: "container.volumeMounts[].recursiveReadOnly", status: Works, reason: "Enabled and IfPossible with runc's rro where runc lists it (1.1+) and the kernel has mount_setattr (5.12+); Enabled elsewhere is the kubelet's CreateContainerConfigError, IfPossible a plain read-only mount; containerStatuses[].volumeMounts say which"},
	{path: "container.volumeMounts[].mountPath", status: Works},
	{path: "container.volumeMounts[].subPath", status: Works, reason: "resolved inside the volume; links out of it are refused"},
	{path: "container.volumeMounts[].mountPropagation", status: Works, reason: "None, HostToContainer (rslave), Bidirectional (rshared, privileged only), as CRI maps them"},
	{path: "container.volumeMounts[].subPathExpr", status: Works, reason: "$(VAR) from the container's env, then resolved as a subPath"},
	{path: "container.volumeMounts[].bindMountOptions", status: Refused, reason: alpha("VolumeBindMountOptions")},
	{path: "container.volumeDevices", status: Refused, reason: "block devices need persistentVolumeClaim volumes: " + whyAPIServer},
	{path: "container.livenessProbe", status: Works, reason: "restarts the container after failureThreshold failures; made by noderun itself (exec through containerd)"},
	{path: "container.livenessProbe.exec", status: Works},
	{path: "container.livenessProbe.exec.command", status: Works},
	{path: "container.livenessProbe.httpGet", status: Works},
	{path: "container.livenessProbe.httpGet.path", status: Works},
	{path: "container.livenessProbe.httpGet.port", status: Works},
	{path: "container.livenessProbe.httpGet.host", status: Works},
	{path: "container.livenessProbe.httpGet.scheme", status: Works},
	{path: "container.livenessProbe.httpGet.httpHeaders", status: Works},
	{path: "container.livenessProbe.httpGet.protocol", status: Refused, reason: whyH2CProbe},
	{path: "container.livenessProbe.httpGet.httpHeaders[].name", status: Works},
	{path: "container.livenessProbe.httpGet.httpHeaders[].value", status: Works},
	{path: "container.livenessProbe.tcpSocket", status: Works},
	{path: "container.livenessProbe.tcpSocket.port", status: Works},
	{path: "container.livenessProbe.tcpSocket.host", status: Works},
	{path: "container.livenessProbe.grpc", status: Works},
	{path: "container.livenessProbe.grpc.port", status: Works},
	{path: "container.livenessProbe.grpc.service", status: Works},
	{path: "container.livenessProbe.grpc.mode", status: Refused, reason: whyTLSProbe, accept: equals("Plaintext")},
	{path: "container.livenessProbe.initialDelaySeconds", status: Works},
	{path: "container.livenessProbe.timeoutSeconds", status: Works},
	{path: "container.livenessProbe.periodSeconds", status: Works},
	{path: "container.livenessProbe.successThreshold", status: Works},
	{path: "container.livenessProbe.failureThreshold", status: Works},
	{path: "container.livenessProbe.terminationGracePeriodSeconds", status: Works},
	{path: "container.readinessProbe", status: Works, reason: "drives the container's ready and the pod's Ready; made by noderun itself (exec through containerd)"},
	{path: "container.readinessProbe.exec", status: Works},
	{path: "container.readinessProbe.exec.command", status: Works},
	{path: "container.readinessProbe.httpGet", status: Works},
	{path: "container.readinessProbe.httpGet.path", status: Works},
	{path: "container.readinessProbe.httpGet.port", status: Works},
	{path: "container.readinessProbe.httpGet.host", status: Works},
	{path: "container.readinessProbe.httpGet.scheme", status: Works},
	{path: "container.readinessProbe.httpGet.httpHeaders", status: Works},
	{path: "container.readinessProbe.httpGet.protocol", status: Refused, reason: whyH2CProbe},
	{path: "container.readinessProbe.httpGet.httpHeaders[].name", status: Works},
	{path: "container.readinessProbe.httpGet.httpHeaders[].value", status: Works},
	{path: "container.readinessProbe.tcpSocket", status: Works},
	{path: "container.readinessProbe.tcpSocket.port", status: Works},
	{path: "container.readinessProbe.tcpSocket.host", status: Works},
	{path: "container.readinessProbe.grpc", status: Works},
	{path: "container.readinessProbe.grpc.port", status: Works},
	{path: "container.readinessProbe.grpc.service", status: Works},
	{path: "container.readinessProbe.grpc.mode", status: Refused, reason: whyTLSProbe, accept: equals("Plaintext")},
	{path: "container.readinessProbe.initialDelaySeconds", status: Works},
	{path: "container.readinessProbe.timeoutSeconds", status: Works},
	{path: "container.readinessProbe.periodSeconds", status: Works},
	{path: "container.readinessProbe.successThreshold", status: Works},
	{path: "container.readinessProbe.failureThreshold", status: Works},
	{path: "container.readinessProbe.terminationGracePeriodSeconds", status: Works},
	{path: "container.startupProbe", status: Works, reason: "holds liveness and readiness until it succeeds; made by noderun itself (exec through containerd)"},
	{path: "container.startupProbe.exec", status: Works},
	{path: "container.startupProbe.exec.command", status: Works},
	{path: "container.startupProbe.httpGet", status: Works},
	{path: "container.startupProbe.httpGet.path", status: Works},
	{path: "container.startupProbe.httpGet.port", status: Works},
	{path: "container.startupProbe.httpGet.host", status: Works},
	{path: "container.startupProbe.httpGet.scheme", status: Works},
	{path: "container.startupProbe.httpGet.httpHeaders", status: Works},
	{path: "container.startupProbe.httpGet.protocol", status: Refused, reason: whyH2CProbe},
	{path: "container.startupProbe.httpGet.httpHeaders[].name", status: Works},
	{path: "container.startupProbe.httpGet.httpHeaders[].value", status: Works},
	{path: "container.startupProbe.tcpSocket", status: Works},
	{path: "container.startupProbe.tcpSocket.port", status: Works},
	{path: "container.startupProbe.tcpSocket.host", status: Works},
	{path: "container.startupProbe.grpc", status: Works},
	{path: "container.startupProbe.grpc.port", status: Works},
	{path: "container.startupProbe.grpc.service", status: Works},
	{path: "container.startupProbe.grpc.mode", status: Refused, reason: whyTLSProbe, accept: equals("Plaintext")},
	{path: "container.startupProbe.initialDelaySeconds", status: Works},
	{path: "container.startupProbe.timeoutSeconds", status: Works},
	{path: "container.startupProbe.periodSeconds", status: Works},
	{path: "container.startupProbe.successThreshold", status: Works},
	{path: "container.startupProbe.failureThreshold", status: Works},
	{path: "container.startupProbe.terminationGracePeriodSeconds", status: Works},
	{path: "container.lifecycle", status: Works},
	{path: "container.lifecycle.postStart", status: Works, reason: "the container counts as running once it returns; a failure kills it"},
	{path: "container.lifecycle.postStart.exec", status: Works},
	{path: "container.lifecycle.postStart.exec.command", status: Works},
	{path: "container.lifecycle.postStart.httpGet", status: Works},
	{path: "container.lifecycle.postStart.httpGet.path", status: Works},
	{path: "container.lifecycle.postStart.httpGet.port", status: Works},
	{path: "container.lifecycle.postStart.httpGet.host", status: Works},
	{path: "container.lifecycle.postStart.httpGet.scheme", status: Works},
	{path: "container.lifecycle.postStart.httpGet.httpHeaders", status: Works},
	{path: "container.lifecycle.postStart.httpGet.protocol", status: Refused, reason: whyH2CProbe},
	{path: "container.lifecycle.postStart.httpGet.httpHeaders[].name", status: Works},
	{path: "container.lifecycle.postStart.httpGet.httpHeaders[].value", status: Works},
	{path: "container.lifecycle.postStart.sleep", status: Works},
	{path: "container.lifecycle.postStart.sleep.seconds", status: Works},
	{path: "container.lifecycle.postStart.tcpSocket", status: Refused, reason: "deprecated: the kubelet does not run it as a hook"},
	{path: "container.lifecycle.preStop", status: Works, reason: "runs before the stop signal, inside the grace period"},
	{path: "container.lifecycle.preStop.exec", status: Works},
	{path: "container.lifecycle.preStop.exec.command", status: Works},
	{path: "container.lifecycle.preStop.httpGet", status: Works},
	{path: "container.lifecycle.preStop.httpGet.path", status: Works},
	{path: "container.lifecycle.preStop.httpGet.port", status: Works},
	{path: "container.lifecycle.preStop.httpGet.host", status: Works},
	{path: "container.lifecycle.preStop.httpGet.scheme", status: Works},
	{path: "container.lifecycle.preStop.httpGet.httpHeaders", status: Works},
	{path: "container.lifecycle.preStop.httpGet.protocol", status: Refused, reason: whyH2CProbe},
	{path: "container.lifecycle.preStop.httpGet.httpHeaders[].name", status: Works},
	{path: "container.lifecycle.preStop.httpGet.httpHeaders[].value", status: Works},
	{path: "container.lifecycle.preStop.sleep", status: Works},
	{path: "container.lifecycle.preStop.sleep.seconds", status: Works},
	{path: "container.lifecycle.preStop.tcpSocket", status: Refused, reason: "deprecated: the kubelet does not run it as a hook"},
	{path: "container.lifecycle.stopSignal", status: Refused, reason: alpha("ContainerStopSignals")},
	{path: "container.terminationMessagePath", status: Works, reason: "a file per run bound there; read into state.terminated.message (4 KiB)"},
	{path: "container.terminationMessagePolicy", status: Works, reason: "FallbackToLogsOnError takes the log's last 80 lines (2 KiB) when the file is empty and the exit failed"},
	{path: "container.imagePullPolicy", status: Works},
	{path: "container.securityContext", status: Works},
	{path: "container.securityContext.capabilities", status: Works},
	{path: "container.securityContext.capabilities.add", status: Works},
	{path: "container.securityContext.capabilities.drop", status: Works},
	{path: "container.securityContext.privileged", status: Works},
	{path: "container.securityContext.seLinuxOptions", status: Ignored, reason: whySELinux},
	{path: "container.securityContext.windowsOptions", status: Ignored, reason: whyWindows},
	{path: "container.securityContext.runAsUser", status: Works},
	{path: "container.securityContext.runAsGroup", status: Works},
	{path: "container.securityContext.runAsNonRoot", status: Works},
	{path: "container.securityContext.readOnlyRootFilesystem", status: Works},
	{path: "container.securityContext.allowPrivilegeEscalation", status: Works},
	{path: "container.securityContext.procMount", status: Works, reason: "Unmasked (nothing of /proc masked or read-only) only with hostUsers: false, as the API server"},
	{path: "container.securityContext.seccompProfile", status: Works},
	{path: "container.securityContext.seccompProfile.type", status: Works},
	{path: "container.securityContext.seccompProfile.localhostProfile", status: Works, reason: "read from <state-dir>/seccomp/"},
	{path: "container.securityContext.appArmorProfile", status: Works, reason: "applied where AppArmor is enabled; elsewhere a pod asking for a profile other than Unconfined is rejected at admission (reason AppArmor), as by the kubelet"},
	{path: "container.securityContext.appArmorProfile.type", status: Works},
	{path: "container.securityContext.appArmorProfile.localhostProfile", status: Works},
	{path: "container.stdin", status: Works, reason: "open and empty until `kubectl attach -i` (or `noderun attach -i`) writes to it; each restart gets a new one"},
	{path: "container.stdinOnce", status: Works, reason: "the first attach's end closes stdin (without tty, as containerd's CRI does)"},
	{path: "container.tty", status: Works, reason: "a terminal for the process (TERM=xterm unless set); its output is logged as stdout"},

	{path: "spec.restartPolicy", status: Works},
	{path: "spec.terminationGracePeriodSeconds", status: Works},
	{path: "spec.activeDeadlineSeconds", status: Works, reason: "counted from the pod's start; the pod ends Failed, reason DeadlineExceeded"},
	{path: "spec.dnsPolicy", status: Works, reason: "ClusterFirst falls back to Default: there is no cluster DNS"},
	{path: "spec.nodeSelector", status: Works, reason: whyAdmission},
	{path: "spec.serviceAccountName", status: Refused, reason: StaticPodReference("serviceaccounts")},
	{path: "spec.serviceAccount", status: Refused, reason: "deprecated alias of serviceAccountName: " + StaticPodReference("serviceaccounts")},
	{path: "spec.automountServiceAccountToken", status: Ignored, reason: "no token to mount without an API server"},
	{path: "spec.nodeName", status: Works, reason: "set to this node's name, as the kubelet does for static pods"},
	{path: "spec.hostNetwork", status: Works},
	{path: "spec.hostPID", status: Works},
	{path: "spec.hostIPC", status: Works, reason: "the host's IPC namespace and /dev/shm; otherwise the pod has its own 64 MiB /dev/shm"},
	{path: "spec.shareProcessNamespace", status: Works, reason: "PID 1 is noderun's pause process (chrooted to an empty dir, nobody, no capabilities)"},
	{path: "spec.securityContext", status: Works},
	{path: "spec.securityContext.seLinuxOptions", status: Ignored, reason: whySELinux},
	{path: "spec.securityContext.windowsOptions", status: Ignored, reason: whyWindows},
	{path: "spec.securityContext.runAsUser", status: Works},
	{path: "spec.securityContext.runAsGroup", status: Works},
	{path: "spec.securityContext.runAsNonRoot", status: Works},
	{path: "spec.securityContext.supplementalGroups", status: Works},
	{path: "spec.securityContext.supplementalGroupsPolicy", status: Works},
	{path: "spec.securityContext.fsGroup", status: Works, reason: "emptyDir, downwardAPI, configMap, secret and projected volumes are given to the group"},
	{path: "spec.securityContext.sysctls", status: Works, reason: "the kubelet's safe set, others with --allowed-unsafe-sysctls; only the pod's own namespaces"},
	{path: "spec.securityContext.sysctls[].name", status: Works},
	{path: "spec.securityContext.sysctls[].value", status: Works},
	{path: "spec.securityContext.fsGroupChangePolicy", status: Works},
	{path: "spec.securityContext.seccompProfile", status: Works},
	{path: "spec.securityContext.seccompProfile.type", status: Works},
	{path: "spec.securityContext.seccompProfile.localhostProfile", status: Works},
	{path: "spec.securityContext.appArmorProfile", status: Works},
	{path: "spec.securityContext.appArmorProfile.type", status: Works},
	{path: "spec.securityContext.appArmorProfile.localhostProfile", status: Works},
	{path: "spec.securityContext.seLinuxChangePolicy", status: Ignored, reason: whySELinux},
	{path: "spec.imagePullSecrets", status: Refused, reason: StaticPodReference("secrets")},
	{path: "spec.hostname", status: Works},
	{path: "spec.subdomain", status: Works},
	{path: "spec.affinity", status: Works},
	{path: "spec.affinity.nodeAffinity", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", status: Works, reason: whyAdmission},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[].key", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[].operator", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[].values", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchFields", status: Works, reason: "metadata.name, the node's name"},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchFields[].key", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchFields[].operator", status: Works},
	{path: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchFields[].values", status: Works},
	{path: "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution", status: Ignored, reason: whyScheduling},
	{path: "spec.affinity.podAffinity", status: Ignored, reason: whyPodAffin},
	{path: "spec.affinity.podAntiAffinity", status: Ignored, reason: whyPodAffin},
	{path: "spec.schedulerName", status: Ignored, reason: whyScheduling},
	{path: "spec.tolerations", status: Ignored, reason: "the kubelet checks no taint for static pods, and noderun evicts nothing"},
	{path: "spec.hostAliases", status: Works},
	{path: "spec.hostAliases[].ip", status: Works},
	{path: "spec.hostAliases[].hostnames", status: Works},
	{path: "spec.priorityClassName", status: Works, reason: "system-node-critical gives every container oom_score_adj -997, as the kubelet does for a static pod of that class (every noderun pod is static, so critical); with graceful node shutdown, system-node-critical and system-cluster-critical pods stop last, in the critical period (their priority, as the API server would set it); no PriorityClass is looked up, so other names change nothing here, as for the kubelet's static pods"},
	{path: "spec.priority", status: Works, reason: "orders graceful node shutdown as the kubelet's: 2000000000 and more stops last, in the critical period; static pods are critical whatever their priority (the kubelet's IsCriticalPod), and there is no preemption or eviction"},
	{path: "spec.dnsConfig", status: Works},
	{path: "spec.dnsConfig.nameservers", status: Works},
	{path: "spec.dnsConfig.searches", status: Works},
	{path: "spec.dnsConfig.options", status: Works},
	{path: "spec.dnsConfig.options[].name", status: Works},
	{path: "spec.dnsConfig.options[].value", status: Works},
	{path: "spec.readinessGates", status: Refused, reason: "their conditions are set through the API server"},
	{path: "spec.runtimeClassName", status: Refused, reason: "noderun has one runtime (runc) and no RuntimeClass objects"},
	{path: "spec.enableServiceLinks", status: Ignored, reason: "no Services on a standalone node, so there are no service variables either way"},
	{path: "spec.preemptionPolicy", status: Ignored, reason: whyScheduling},
	{path: "spec.overhead", status: Refused, reason: "set by RuntimeClass admission: " + whyAPIServer},
	{path: "spec.topologySpreadConstraints", status: Ignored, reason: whyScheduling},
	{path: "spec.setHostnameAsFQDN", status: Works, reason: "with a subdomain, the hostname is <hostname>.<subdomain>.<namespace>.svc.cluster.local (64 characters at most); hostNetwork pods keep the node's"},
	{path: "spec.os", status: Works},
	{path: "spec.os.name", status: Refused, reason: "linux or windows, as the API server accepts; a windows pod is rejected at admission (reason PodOSNotSupported, phase Failed), as by the kubelet on a Linux node", accept: oneOf("linux", "windows")},
	{path: "spec.hostUsers", status: Works, reason: "false: a user namespace of the pod's own, 65536 IDs from 65536·n kept in the pod's state dir, rootfs and volumes idmapped, as the kubelet with containerd 2; needs containerd 2 and runc 1.2 (idmapped mounts), elsewhere the pod is rejected at admission with the kubelet's message; not with hostNetwork, hostPID, hostIPC or shareProcessNamespace"},
	{path: "spec.schedulingGates", status: Ignored, reason: whyScheduling},
	{path: "spec.schedulingGroup", status: Refused, reason: "beta and off by default in Kubernetes v1.37 (the GenericWorkload feature gate)"},
	{path: "spec.resourceClaims", status: Refused, reason: StaticPodReference("resourceclaims")},
	{path: "spec.resources", status: Works, reason: "pod-level requests and limits (PodLevelResources, beta and on in Kubernetes v1.37): the pod's cgroup, its QoS class, the limits of containers that have none, OOM scores and admission, as the kubelet; not defaulted from the containers', as for the kubelet's static pods"},
	{path: "spec.resources.limits", status: Refused, reason: whyPodLevel, accept: cpuOrMemory},
	{path: "spec.resources.requests", status: Refused, reason: whyPodLevel, accept: cpuOrMemory},
	{path: "spec.resources.claims", status: Refused, reason: "claims may not be set for resources at pod level (Kubernetes); claims need an API server"},
	{path: "spec.hostnameOverride", status: Works, reason: "the pod's hostname (UTS name, /etc/hostname, /etc/hosts) in place of hostname and subdomain; not with hostNetwork or setHostnameAsFQDN, as the API server"},
	{path: "spec.evictionResponders", status: Refused, reason: alpha("EvictionRequestAPI")},
	{path: "spec.ephemeralContainers", status: Refused, reason: "static pods do not support ephemeral containers in their manifests, as in Kubernetes v1.37: they are added to a running pod through the local API (kubectl debug)"},
}

// ruleIndex finds a rule by path.
var ruleIndex = func() map[string]*fieldRule {
	m := map[string]*fieldRule{}
	for i := range fieldRules {
		m[fieldRules[i].path] = &fieldRules[i]
	}
	return m
}()

func equals(want string) func(reflect.Value) bool {
	return func(v reflect.Value) bool { return fmt.Sprint(reflect.Indirect(v).Interface()) == want }
}

func oneOf(want ...string) func(reflect.Value) bool {
	return func(v reflect.Value) bool { return slices.Contains(want, fmt.Sprint(reflect.Indirect(v).Interface())) }
}

// cpuMemoryOrExtended accepts resource lists of cpu, memory and extended
// resources.
func cpuMemoryOrExtended(v reflect.Value) bool {
	for name := range v.Interface().(v1.ResourceList) {
		if name != v1.ResourceCPU && name != v1.ResourceMemory && !admission.IsExtendedResource(name) {
			return false
		}
	}
	return true
}

// cpuOrMemory accepts resource lists of cpu and memory only.
func cpuOrMemory(v reflect.Value) bool {
	for name := range v.Interface().(v1.ResourceList) {
		if name != v1.ResourceCPU && name != v1.ResourceMemory {
			return false
		}
	}
	return true
}

// via is the refers of a field that always references the same resource.
func via(resource string) func(reflect.Value) string {
	return func(reflect.Value) string { return resource }
}

// projectedReference names the first source of a projected volume that
// references an API object, as the kubelet words it; "" when its sources
// are downwardAPI only.
func projectedReference(v reflect.Value) string {
	for _, s := range v.Interface().(*v1.ProjectedVolumeSource).Sources {
		switch {
		case s.ConfigMap != nil:
			return "configmaps (via projected volumes)"
		case s.Secret != nil:
			return "secrets (via projected volumes)"
		case s.ServiceAccountToken != nil:
			return "serviceaccounts (via projected volumes)"
		case s.ClusterTrustBundle != nil:
			return "clustertrustbundles"
		case s.PodCertificate != nil:
			return "podcertificates"
		}
	}
	return ""
}

// fieldFinding is a set field that is refused or ignored.
type fieldFinding struct {
	path   string // concrete, e.g. spec.containers[1].livenessProbe
	status FieldStatus
	reason string
	// refers: an OptIn field refused without --local-config-objects, the
	// API resource it references in the kubelet's words.
	refers string
}

// fieldWalker walks a pod's set fields against the lists.
type fieldWalker struct {
	localConfig bool // OptIn fields work
	out         []fieldFinding
}

// checkFields walks what the manifest set (before defaulting, so that only
// fields the user wrote count) and reports refused and ignored fields.
func checkFields(pod *v1.Pod, opts parseOptions) []fieldFinding {
	w := &fieldWalker{localConfig: opts.localConfig}
	w.walkValue(reflect.ValueOf(pod).Elem(), "", "")
	return w.out
}

// walkable says whether the walks go into a struct type: the core/v1 types
// and the Pod's metadata, not apimachinery's leaves (quantities, times).
func walkable(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && (t.PkgPath() == corePkg || t == objectMetaType)
}

var objectMetaType = reflect.TypeOf(metav1.ObjectMeta{})

// walkValue visits the fields of the struct v; concrete is the path with
// indexes, key the rule path.
func (w *fieldWalker) walkValue(v reflect.Value, concrete, key string) {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		name := jsonName(f)
		if name == "" {
			w.walkValue(fv, concrete, key) // inline (TypeMeta, VolumeSource)
			continue
		}
		if fv.IsZero() {
			continue
		}
		fkey := join(key, name)
		if fkey == "spec.containers" || fkey == "spec.initContainers" {
			for j := range fv.Len() {
				w.walkValue(fv.Index(j), fmt.Sprintf("%s.%s[%d]", concrete, name, j), "container")
			}
			continue
		}
		fconcrete := join(concrete, name)
		r := ruleIndex[fkey]
		switch {
		case r == nil:
			w.out = append(w.out, fieldFinding{path: fconcrete, status: Refused, reason: "not classified"})
		case r.status == Ignored:
			w.out = append(w.out, fieldFinding{path: fconcrete, status: Ignored, reason: r.reason})
		case r.status == Refused && (r.accept == nil || !r.accept(fv)):
			w.out = append(w.out, fieldFinding{path: fconcrete, status: Refused, reason: r.reason})
		case r.status == OptIn && !w.localConfig:
			w.out = append(w.out, optInRefused(r, fv, fconcrete))
		default:
			w.descend(fv, fconcrete, fkey)
		}
	}
}

// optInRefused is the finding of an OptIn field set without
// --local-config-objects: the kubelet's refusal of what it references.
func optInRefused(r *fieldRule, v reflect.Value, path string) fieldFinding {
	refers := referredResource(v)
	if r.refers != nil {
		refers = r.refers(v)
	}
	if refers == "" { // references nothing (envFrom: [{}]): its rule says why
		return fieldFinding{path: path, status: Refused, reason: r.reason}
	}
	return fieldFinding{path: path, status: Refused, reason: StaticPodReference(refers), refers: refers}
}

// descend walks into a Works field that holds core/v1 structs.
func (w *fieldWalker) descend(v reflect.Value, concrete, key string) {
	switch v.Kind() {
	case reflect.Pointer:
		w.descend(v.Elem(), concrete, key)
	case reflect.Slice:
		for j := range v.Len() {
			w.descend(v.Index(j), fmt.Sprintf("%s[%d]", concrete, j), key+"[]")
		}
	case reflect.Struct:
		if walkable(v.Type()) {
			w.walkValue(v, concrete, key)
		}
	}
}

// referredResource names the API resource an OptIn field's value refers
// to, as the kubelet's static pod check does: secrets before configmaps.
// Its struct types tell: Secret* and ConfigMap* types are the references.
func referredResource(v reflect.Value) string {
	found := map[string]bool{}
	var visit func(reflect.Value)
	visit = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if !v.IsNil() {
				visit(v.Elem())
			}
		case reflect.Slice:
			for i := range v.Len() {
				visit(v.Index(i))
			}
		case reflect.Struct:
			name := v.Type().Name()
			switch {
			case strings.HasPrefix(name, "Secret"):
				found["secrets"] = true
			case strings.HasPrefix(name, "ConfigMap"):
				found["configmaps"] = true
			}
			for i := range v.NumField() {
				visit(v.Field(i))
			}
		}
	}
	visit(v)
	switch {
	case found["secrets"]:
		return "secrets"
	case found["configmaps"]:
		return "configmaps"
	}
	return "" // refers to nothing (envFrom: []): refused by its rule
}

const corePkg = "k8s.io/api/core/v1"

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// fieldErrors turns findings into errors (refused) and warnings (ignored).
func fieldErrors(findings []fieldFinding) (errs, warnings []error) {
	for _, f := range findings {
		me := &ManifestError{Field: f.path}
		switch {
		case strings.HasPrefix(f.refers, "secrets") || strings.HasPrefix(f.refers, "configmaps"):
			// The kubelet's own words, then the way to run it here.
			me.Message = f.reason + "; noderun runs such pods with --local-config-objects, from ConfigMap and Secret documents in the manifest sources"
			errs = append(errs, me)
		case f.status == Refused:
			me.Message = "not supported by noderun: " + f.reason
			errs = append(errs, me)
		default:
			me.Message = "ignored: " + f.reason
			warnings = append(warnings, me)
		}
	}
	return errs, warnings
}

package manifests

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// podWith wraps a spec body (YAML indented by two spaces) in a Pod named web.
func podWith(spec string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n" + spec
}

const oneContainer = "  containers:\n  - name: app\n    image: nginx:1.29\n"

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // the only error expected; "" for a valid pod
	}{
		{name: "minimal pod", in: podWith(oneContainer)},
		{
			name: "extended resource limit, request defaulted from it",
			in:   podWith("  containers:\n  - {name: a, image: busybox, resources: {limits: {example.com/foo: 2}}}\n"),
		},
		{
			name:    "extended resource request without a limit",
			in:      podWith("  containers:\n  - {name: a, image: busybox, resources: {requests: {example.com/foo: 2}}}\n"),
			wantErr: `spec.containers[0].resources.requests[example.com/foo]: Limit must be set for non overcommitable resources`,
		},
		{
			name:    "extended resource request other than its limit",
			in:      podWith("  containers:\n  - {name: a, image: busybox, resources: {requests: {example.com/foo: 1}, limits: {example.com/foo: 2}}}\n"),
			wantErr: `spec.containers[0].resources.requests[example.com/foo]: 1: must be equal to example.com/foo limit of 2`,
		},
		{
			name:    "extended resource that is not whole",
			in:      podWith("  containers:\n  - {name: a, image: busybox, resources: {requests: {example.com/foo: 500m}, limits: {example.com/foo: 1}}}\n"),
			wantErr: `spec.containers[0].resources.requests[example.com/foo]: 500m: must be an integer`,
		},
		{
			name: "bandwidth annotations",
			in:   "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: {kubernetes.io/ingress-bandwidth: 10M, kubernetes.io/egress-bandwidth: 1Gi}\nspec:\n" + oneContainer,
		},
		{
			name:    "bandwidth annotation below the kubelet's bound",
			in:      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: {kubernetes.io/egress-bandwidth: \"10\"}\nspec:\n" + oneContainer,
			wantErr: `metadata.annotations[kubernetes.io/egress-bandwidth]: "10" is unreasonably small (< 1kbit)`,
		},
		{
			name:    "bandwidth annotation that is no quantity",
			in:      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: {kubernetes.io/ingress-bandwidth: fast}\nspec:\n" + oneContainer,
			wantErr: `metadata.annotations[kubernetes.io/ingress-bandwidth]: "fast": quantities must match the regular expression`,
		},
		{
			name: "sidecar init container",
			in:   podWith("  initContainers:\n  - {name: side, image: busybox, restartPolicy: Always, readinessProbe: {tcpSocket: {port: 80}}}\n" + oneContainer),
		},
		{
			name: "init container restartPolicy OnFailure",
			in:   podWith("  initContainers:\n  - {name: setup, image: busybox, restartPolicy: OnFailure}\n" + oneContainer),
		},
		{
			name:    "init container restartPolicy unknown",
			in:      podWith("  initContainers:\n  - {name: setup, image: busybox, restartPolicy: Sometimes}\n" + oneContainer),
			wantErr: `spec.initContainers[0].restartPolicy: unsupported value "Sometimes": supported values: Always, Never, OnFailure`,
		},
		{
			name: "restart rules on an app container",
			in: podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [" +
				"{action: Restart, exitCodes: {operator: In, values: [42]}}, {action: RestartAllContainers, exitCodes: {operator: NotIn, values: [0, 1]}}]}\n"),
		},
		{
			name:    "restart rules without restartPolicy",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}]}\n"),
			wantErr: "spec.containers[0].restartPolicy: must specify restartPolicy when restart rules are used",
		},
		{
			name:    "restart rule without exitCodes",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [{action: Restart}]}\n"),
			wantErr: "spec.containers[0].restartPolicyRules[0].exitCodes: required",
		},
		{
			name:    "restart rule with an unknown action",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [{action: Stop, exitCodes: {operator: In, values: [1]}}]}\n"),
			wantErr: `spec.containers[0].restartPolicyRules[0].action: unsupported value "Stop": supported values: Restart, RestartAllContainers`,
		},
		{
			name:    "restart rule with an empty operator",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [{action: Restart, exitCodes: {values: [1]}}]}\n"),
			wantErr: `spec.containers[0].restartPolicyRules[0].exitCodes.operator: unsupported value "": supported values: In, NotIn`,
		},
		{
			name:    "more than 20 restart rules",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [" + strings.Repeat("{action: Restart, exitCodes: {operator: In, values: [1]}},", 21) + "]}\n"),
			wantErr: "spec.containers[0].restartPolicyRules: must have at most 20 items",
		},
		{
			name:    "more than 255 exit codes",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never, restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [" + strings.Repeat("1,", 256) + "]}}]}\n"),
			wantErr: "spec.containers[0].restartPolicyRules[0].exitCodes.values: must have at most 255 items",
		},
		{
			name:    "probe on a regular init container",
			in:      podWith("  initContainers:\n  - {name: i, image: busybox, livenessProbe: {exec: {command: ['true']}}}\n" + oneContainer),
			wantErr: "spec.initContainers[0].livenessProbe: may not be set for init containers without restartPolicy=Always",
		},
		{
			name:    "hook on a regular init container",
			in:      podWith("  initContainers:\n  - {name: i, image: busybox, lifecycle: {postStart: {exec: {command: ['true']}}}}\n" + oneContainer),
			wantErr: "spec.initContainers[0].lifecycle: may not be set for init containers without restartPolicy=Always",
		},
		{
			name:    "liveness successThreshold",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    livenessProbe: {tcpSocket: {port: 80}, successThreshold: 2}\n"),
			wantErr: "spec.containers[0].livenessProbe.successThreshold: must be 1",
		},
		{
			name:    "readiness probe grace period",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    readinessProbe: {tcpSocket: {port: 80}, terminationGracePeriodSeconds: 5}\n"),
			wantErr: "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: must not be set for readinessProbes",
		},
		{
			name:    "two probe handlers",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    startupProbe: {tcpSocket: {port: 80}, grpc: {port: 80}}\n"),
			wantErr: "spec.containers[0].startupProbe: may not specify more than 1 handler type",
		},
		{
			name:    "bad named port",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    readinessProbe: {httpGet: {port: Not_A_Name}}\n"),
			wantErr: "spec.containers[0].readinessProbe.httpGet.port:",
		},
		{
			name:    "empty exec hook",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    lifecycle: {preStop: {exec: {command: []}}}\n"),
			wantErr: "spec.containers[0].lifecycle.preStop.exec.command: required",
		},
		{
			name:    "sleep hook longer than the grace period",
			in:      podWith("  terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: nginx\n    lifecycle: {preStop: {sleep: {seconds: 6}}}\n"),
			wantErr: "spec.containers[0].lifecycle.preStop.sleep.seconds: must be non-negative and less than terminationGracePeriodSeconds (5)",
		},
		{
			name:    "relative terminationMessagePath",
			in:      podWith("  containers:\n  - {name: app, image: nginx, terminationMessagePath: msg}\n"),
			wantErr: "spec.containers[0].terminationMessagePath: must be an absolute path",
		},
		{
			name:    "missing name",
			in:      "apiVersion: v1\nkind: Pod\nspec:\n" + oneContainer,
			wantErr: "metadata.name: required",
		},
		{
			name:    "name not DNS-1123",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: Web_1}\nspec:\n" + oneContainer,
			wantErr: "metadata.name: a lowercase RFC 1123 subdomain must consist of",
		},
		{
			name:    "bad namespace",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: kube.system}\nspec:\n" + oneContainer,
			wantErr: "metadata.namespace: must not contain dots",
		},
		{
			name:    "no containers",
			in:      podWith("  restartPolicy: Never\n"),
			wantErr: "spec.containers: at least one container is required",
		},
		{
			name:    "missing image",
			in:      podWith("  containers:\n  - name: app\n"),
			wantErr: "spec.containers[0].image: required",
		},
		{
			name:    "duplicate container name across init and app",
			in:      podWith("  initContainers:\n  - {name: app, image: busybox}\n" + oneContainer),
			wantErr: `spec.containers[0].name: duplicate container name "app"`,
		},
		{
			name:    "container name not a label",
			in:      podWith("  containers:\n  - {name: App, image: nginx}\n"),
			wantErr: "spec.containers[0].name: a lowercase RFC 1123 label must consist of",
		},
		{
			name:    "bad restartPolicy",
			in:      podWith("  restartPolicy: Sometimes\n" + oneContainer),
			wantErr: `spec.restartPolicy: unsupported value "Sometimes": supported values: Always, OnFailure, Never`,
		},
		{
			name: "pod-level resources",
			in: podWith("  resources: {requests: {cpu: 500m, memory: 64Mi}, limits: {cpu: '1', memory: 128Mi}}\n" +
				"  containers:\n  - {name: a, image: nginx, resources: {requests: {cpu: 200m}, limits: {memory: 64Mi}}}\n  - {name: b, image: nginx}\n"),
		},
		{
			name:    "pod-level request below the containers' aggregate",
			in:      podWith("  resources: {requests: {cpu: 100m}}\n  containers:\n  - {name: a, image: nginx, resources: {requests: {cpu: 200m}}}\n"),
			wantErr: "spec.resources.requests[cpu]: 100m: must be greater than or equal to aggregate container requests of 200m",
		},
		{
			name:    "container limit above the pod's",
			in:      podWith("  resources: {limits: {memory: 64Mi}}\n  containers:\n  - {name: a, image: nginx, resources: {limits: {memory: 128Mi}}}\n"),
			wantErr: "spec.resources.containers[0][memory].limits: 128Mi: must be less than or equal to pod limits of 64Mi",
		},
		{
			name:    "pod-level request above its limit",
			in:      podWith("  resources: {requests: {cpu: '2'}, limits: {cpu: '1'}}\n" + oneContainer),
			wantErr: "spec.resources.requests: 2: must be less than or equal to cpu limit of 1",
		},
		{
			name:    "pod-level hugepages",
			in:      podWith("  resources: {limits: {hugepages-2Mi: 2Mi, memory: 64Mi}}\n" + oneContainer),
			wantErr: "spec.resources.limits: not supported by noderun: pod-level resources are cpu and memory",
		},
		{
			name: "app container restartPolicy",
			in:   podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: Never}\n"),
		},
		{
			name:    "app container restartPolicy unknown",
			in:      podWith("  containers:\n  - {name: app, image: nginx, restartPolicy: \"\"}\n"),
			wantErr: `spec.containers[0].restartPolicy: unsupported value "": supported values: Always, Never, OnFailure`,
		},
		{
			name:    "mount of undefined volume",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    volumeMounts: [{name: data, mountPath: /data}]\n"),
			wantErr: `spec.containers[0].volumeMounts[0].name: volume "data" is not defined in spec.volumes`,
		},
		{
			name:    "port out of range",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    ports: [{containerPort: 70000}]\n"),
			wantErr: "spec.containers[0].ports[0].containerPort: must be between 1 and 65535, inclusive",
		},
		{
			name:    "port zero",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    ports: [{containerPort: 0}]\n"),
			wantErr: "spec.containers[0].ports[0].containerPort: must be between 1 and 65535, inclusive",
		},
		{
			name:    "bad protocol",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    ports: [{containerPort: 80, protocol: ICMP}]\n"),
			wantErr: `spec.containers[0].ports[0].protocol: unsupported value "ICMP"`,
		},
		{
			name:    "hostPort differs with hostNetwork",
			in:      podWith("  hostNetwork: true\n  containers:\n  - name: app\n    image: nginx\n    ports: [{containerPort: 80, hostPort: 8080}]\n"),
			wantErr: "spec.containers[0].ports[0].hostPort: must equal containerPort with hostNetwork",
		},
		{
			name:    "env var name with =",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    env: [{name: A=B, value: x}]\n"),
			wantErr: "spec.containers[0].env[0].name: a valid environment variable name must consist only of printable ASCII characters other than '='",
		},
		{
			name:    "secret env",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    env: [{name: PW, valueFrom: {secretKeyRef: {name: s, key: k}}}]\n"),
			wantErr: "spec.containers[0].env[0].valueFrom.secretKeyRef: static pods may not reference secrets, as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects",
		},
		{
			name:    "configMap envFrom",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    envFrom: [{configMapRef: {name: c}}]\n"),
			wantErr: "spec.containers[0].envFrom: static pods may not reference configmaps, as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects",
		},
		{
			name:    "unsupported downward API field",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    env: [{name: X, valueFrom: {fieldRef: {fieldPath: spec.hostname}}}]\n"),
			wantErr: `spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: unsupported field path "spec.hostname"`,
		},
		{
			name:    "secret volume",
			in:      podWith(oneContainer + "  volumes: [{name: s, secret: {secretName: s}}]\n"),
			wantErr: "spec.volumes[0].secret: static pods may not reference secrets (via secret volumes), as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects",
		},
		{
			name:    "configMap volume",
			in:      podWith(oneContainer + "  volumes: [{name: c, configMap: {name: c}}]\n"),
			wantErr: "spec.volumes[0].configMap: static pods may not reference configmaps (via configmap volumes), as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects",
		},
		{
			name:    "PVC volume",
			in:      podWith(oneContainer + "  volumes: [{name: p, persistentVolumeClaim: {claimName: p}}]\n"),
			wantErr: "spec.volumes[0].persistentVolumeClaim: not supported by noderun: static pods may not reference persistentvolumeclaims, as in Kubernetes v1.37",
		},
		{
			name:    "projected volume",
			in:      podWith(oneContainer + "  volumes: [{name: p, projected: {sources: [{downwardAPI: {}}]}}]\n"),
			wantErr: "spec.volumes[0].projected: not supported by noderun: with --local-config-objects",
		},
		{
			name:    "projected service account token",
			in:      podWith(oneContainer + "  volumes: [{name: p, projected: {sources: [{downwardAPI: {}}, {serviceAccountToken: {path: t}}]}}]\n"),
			wantErr: "spec.volumes[0].projected: not supported by noderun: static pods may not reference serviceaccounts (via projected volumes), as in Kubernetes v1.37",
		},
		{
			name:    "service account",
			in:      podWith(oneContainer + "  serviceAccountName: default\n"),
			wantErr: "spec.serviceAccountName: not supported by noderun: static pods may not reference serviceaccounts, as in Kubernetes v1.37",
		},
		{
			name:    "resource claims",
			in:      podWith(oneContainer + "  resourceClaims: [{name: gpu, resourceClaimName: gpu}]\n"),
			wantErr: "spec.resourceClaims: not supported by noderun: static pods may not reference resourceclaims, as in Kubernetes v1.37",
		},
		{
			name:    "CSI volume",
			in:      podWith(oneContainer + "  volumes: [{name: p, csi: {driver: d}}]\n"),
			wantErr: "spec.volumes[0].csi: not supported by noderun: static pods may not reference csidrivers (via CSI volumes), as in Kubernetes v1.37",
		},
		{
			name:    "NFS volume",
			in:      podWith(oneContainer + "  volumes: [{name: share, nfs: {server: s, path: /x}}]\n"),
			wantErr: "spec.volumes[0].nfs: not supported by noderun: network and cloud volume plugins",
		},
		{
			name:    "volume without a type",
			in:      podWith(oneContainer + "  volumes: [{name: v}]\n"),
			wantErr: "spec.volumes[0]: a volume type is required (emptyDir, hostPath or downwardAPI)",
		},
		{
			name:    "two volume types",
			in:      podWith(oneContainer + "  volumes: [{name: v, emptyDir: {}, hostPath: {path: /x}}]\n"),
			wantErr: "spec.volumes[0]: only one volume type may be set, found hostPath, emptyDir",
		},
		{
			name: "image volume, subPath and subPathExpr into it",
			in: podWith("  containers:\n  - {name: a, image: busybox, env: [{name: D, value: bin}], volumeMounts: [{name: t, mountPath: /t, subPath: etc}, {name: t, mountPath: /u, subPathExpr: $(D)}]}\n" +
				"  volumes: [{name: t, image: {reference: \"tools:1\", pullPolicy: Never}}]\n"),
		},
		{
			name:    "image volume without a reference",
			in:      podWith(oneContainer + "  volumes: [{name: t, image: {pullPolicy: Never}}]\n"),
			wantErr: "spec.volumes[0].image.reference: Required value",
		},
		{
			name:    "image volume with an unknown pullPolicy",
			in:      podWith(oneContainer + "  volumes: [{name: t, image: {reference: tools, pullPolicy: Sometimes}}]\n"),
			wantErr: `spec.volumes[0].image.pullPolicy: unsupported value "Sometimes": supported values: Always, IfNotPresent, Never`,
		},
		{
			name:    "image volume and emptyDir at once",
			in:      podWith(oneContainer + "  volumes: [{name: t, emptyDir: {}, image: {reference: tools}}]\n"),
			wantErr: "spec.volumes[0]: only one volume type may be set, found emptyDir, image",
		},
		{
			name:    "duplicate volume",
			in:      podWith(oneContainer + "  volumes: [{name: v, emptyDir: {}}, {name: v, emptyDir: {}}]\n"),
			wantErr: `spec.volumes[1].name: duplicate volume name "v"`,
		},
		{
			name:    "relative hostPath",
			in:      podWith(oneContainer + "  volumes: [{name: v, hostPath: {path: srv}}]\n"),
			wantErr: "spec.volumes[0].hostPath.path: must be an absolute path",
		},
		{
			name:    "bad hostPath type",
			in:      podWith(oneContainer + "  volumes: [{name: v, hostPath: {path: /srv, type: Folder}}]\n"),
			wantErr: `spec.volumes[0].hostPath.type: unsupported value "Folder"`,
		},
		{
			name:    "downwardAPI item escapes",
			in:      podWith(oneContainer + "  volumes: [{name: v, downwardAPI: {items: [{path: ../x, fieldRef: {fieldPath: metadata.name}}]}}]\n"),
			wantErr: "spec.volumes[0].downwardAPI.items[0].path: must be a relative path without '..'",
		},
		{
			name:    "hostnameOverride with hostNetwork",
			in:      podWith(oneContainer + "  hostNetwork: true\n  hostnameOverride: node-a\n"),
			wantErr: "spec.hostnameOverride: may not be specified when hostNetwork is true",
		},
		{
			name:    "hostnameOverride with setHostnameAsFQDN",
			in:      podWith(oneContainer + "  setHostnameAsFQDN: true\n  hostnameOverride: node-a\n"),
			wantErr: "spec.hostnameOverride: may not be specified when setHostnameAsFQDN is true",
		},
		{
			name:    "hostnameOverride not a DNS subdomain",
			in:      podWith(oneContainer + "  hostnameOverride: Node_A\n"),
			wantErr: "spec.hostnameOverride: a lowercase RFC 1123 subdomain",
		},
		{
			name:    "fileKeyRef into a hostPath",
			in:      podWith(oneContainer[:len(oneContainer)-1] + "\n    env: [{name: A, valueFrom: {fileKeyRef: {volumeName: h, path: a.env, key: A}}}]\n  volumes: [{name: h, hostPath: {path: /tmp}}]\n"),
			wantErr: "spec.containers[0].env[0].valueFrom.fileKeyRef.volumeName: referenced volume must be of type emptyDir",
		},
		{
			name:    "fileKeyRef climbing out",
			in:      podWith(oneContainer[:len(oneContainer)-1] + "\n    env: [{name: A, valueFrom: {fileKeyRef: {volumeName: e, path: ../a.env, key: A}}}]\n  volumes: [{name: e, emptyDir: {}}]\n"),
			wantErr: "spec.containers[0].env[0].valueFrom.fileKeyRef.path: must not contain '..'",
		},
		{
			name:    "fileKeyRef without a volume",
			in:      podWith(oneContainer[:len(oneContainer)-1] + "\n    env: [{name: A, valueFrom: {fileKeyRef: {volumeName: e, path: a.env, key: A}}}]\n"),
			wantErr: `spec.containers[0].env[0].valueFrom.fileKeyRef.volumeName: volume "e" is not defined in spec.volumes`,
		},
		{name: "fileKeyRef", in: podWith(oneContainer[:len(oneContainer)-1] + "\n    env: [{name: A, valueFrom: {fileKeyRef: {volumeName: e, path: a.env, key: A, optional: true}}}]\n  volumes: [{name: e, emptyDir: {}}]\n")},
		{
			name:    "recursiveReadOnly without readOnly",
			in:      podWith(oneContainer[:len(oneContainer)-1] + "\n    volumeMounts: [{name: e, mountPath: /e, recursiveReadOnly: Enabled}]\n  volumes: [{name: e, emptyDir: {}}]\n"),
			wantErr: "spec.containers[0].volumeMounts[0].recursiveReadOnly: may only be specified when readOnly is true",
		},
		{name: "recursiveReadOnly", in: podWith(oneContainer[:len(oneContainer)-1] + "\n    volumeMounts: [{name: e, mountPath: /e, readOnly: true, recursiveReadOnly: IfPossible}]\n  volumes: [{name: e, emptyDir: {}}]\n")},
		{name: "hostnameOverride", in: podWith(oneContainer + "  hostnameOverride: node-a.example\n")},
		{
			name:    "imagePullSecrets",
			in:      podWith(oneContainer + "  imagePullSecrets: [{name: regcred}]\n"),
			wantErr: "spec.imagePullSecrets: not supported by noderun: static pods may not reference secrets, as in Kubernetes v1.37",
		},
		{
			name:    "ephemeral containers",
			in:      podWith(oneContainer + "  ephemeralContainers: [{name: debug, image: busybox}]\n"),
			wantErr: "spec.ephemeralContainers: not supported by noderun: static pods do not support ephemeral containers",
		},
		{
			name:    "probe without a handler",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    readinessProbe: {periodSeconds: 5}\n"),
			wantErr: "spec.containers[0].readinessProbe: must specify a handler type",
		},
		{
			name:    "dnsPolicy None without nameservers",
			in:      podWith("  dnsPolicy: None\n" + oneContainer),
			wantErr: "spec.dnsConfig.nameservers: required when dnsPolicy is None",
		},
		{
			name:    "hostname that would add a line to /etc/hosts",
			in:      podWith("  hostname: \"web\\n10.0.0.1 evil\"\n" + oneContainer),
			wantErr: "spec.hostname: a lowercase RFC 1123 label must consist of",
		},
		{
			name:    "hostAlias with a bad IP",
			in:      podWith("  hostAliases: [{ip: 10.0.0.300, hostnames: [db]}]\n" + oneContainer),
			wantErr: `spec.hostAliases[0].ip: Invalid value: "10.0.0.300": must be a valid IP address`,
		},
		{
			name:    "hostAlias with an IPv4-mapped IPv6 address",
			in:      podWith("  hostAliases: [{ip: '::ffff:10.0.0.1', hostnames: [db]}]\n" + oneContainer),
			wantErr: `spec.hostAliases[0].ip: Invalid value: "::ffff:10.0.0.1": must not be an IPv4-mapped IPv6 address`,
		},
		{
			name:    "hostAlias hostname with a space",
			in:      podWith("  hostAliases: [{ip: 10.0.0.1, hostnames: ['db evil']}]\n" + oneContainer),
			wantErr: "spec.hostAliases[0].hostnames[0]: a lowercase RFC 1123 subdomain",
		},
		{
			name:    "nameserver that is a name",
			in:      podWith("  dnsConfig: {nameservers: [dns.example]}\n" + oneContainer),
			wantErr: `spec.dnsConfig.nameservers[0]: Invalid value: "dns.example": must be a valid IP address`,
		},
		{
			name:    "four nameservers",
			in:      podWith("  dnsConfig: {nameservers: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]}\n" + oneContainer),
			wantErr: "spec.dnsConfig.nameservers: must not have more than 3 nameservers",
		},
		{
			name: "search paths the API server allows: the root, underscores, a trailing dot",
			in:   podWith("  dnsConfig: {searches: ['.', _tcp.example.com, svc.cluster.local.]}\n" + oneContainer),
		},
		{
			name:    "33 search paths",
			in:      podWith("  dnsConfig: {searches: [" + strings.Repeat("a,", 32) + "a]}\n" + oneContainer),
			wantErr: "spec.dnsConfig.searches: must not have more than 32 search paths",
		},
		{
			name:    "search paths over 2048 characters",
			in:      podWith("  dnsConfig: {searches: [" + strings.Repeat(strings.Repeat(strings.Repeat("a", 63)+".", 3)+"a,", 12) + "a]}\n" + oneContainer),
			wantErr: "spec.dnsConfig.searches: must not have more than 2048 characters (including spaces), have 2329",
		},
		{
			name:    "DNS option with a newline",
			in:      podWith("  dnsConfig: {options: [{name: \"ndots:1\\nnameserver\"}]}\n" + oneContainer),
			wantErr: "spec.dnsConfig.options[0].name: must be a non-empty word",
		},
		{
			name:    "subdomain that is not a label",
			in:      podWith("  subdomain: a.b\n" + oneContainer),
			wantErr: "spec.subdomain: must not contain dots",
		},
		{
			name:    "dnsConfig search path with a newline",
			in:      podWith("  dnsConfig: {searches: [\"a.example\\nnameserver 6.6.6.6\"]}\n" + oneContainer),
			wantErr: "spec.dnsConfig.searches[0]: a lowercase RFC 1123 subdomain",
		},
		{
			name:    "metadata.uid that is a path",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: team/app}\nspec:\n" + oneContainer,
			wantErr: `metadata.uid: "team/app" must consist of`,
		},
		{
			name:    "node-wide sysctl",
			in:      podWith("  securityContext: {sysctls: [{name: vm.swappiness, value: '1'}]}\n" + oneContainer),
			wantErr: `spec.securityContext.sysctls[0].name: "vm.swappiness" is not namespaced`,
		},
		{
			name:    "net sysctl with hostNetwork",
			in:      podWith("  hostNetwork: true\n  securityContext: {sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}]}\n" + oneContainer),
			wantErr: `spec.securityContext.sysctls[0].name: "net.ipv4.tcp_syncookies" cannot be set with hostNetwork`,
		},
		{
			name:    "Bidirectional propagation without privileged",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    volumeMounts: [{name: v, mountPath: /v, mountPropagation: Bidirectional}]\n  volumes: [{name: v, hostPath: {path: /mnt}}]\n"),
			wantErr: "spec.containers[0].volumeMounts[0].mountPropagation: Bidirectional mount propagation is available only to privileged containers",
		},
		{
			name:    "subPathExpr climbing out",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    volumeMounts: [{name: v, mountPath: /v, subPathExpr: '../$(X)'}]\n  volumes: [{name: v, emptyDir: {}}]\n"),
			wantErr: "spec.containers[0].volumeMounts[0].subPathExpr: must be a relative path without '..'",
		},
		{
			name:    "duplicate mountPath",
			in:      podWith("  containers:\n  - name: app\n    image: nginx\n    volumeMounts: [{name: v, mountPath: /d}, {name: v, mountPath: /d}]\n  volumes: [{name: v, emptyDir: {}}]\n"),
			wantErr: `spec.containers[0].volumeMounts[1].mountPath: "/d" is mounted more than once`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := mustDecode(t, tt.in)
			errs, _ := checkPod(pod, parseOptions{})
			if tt.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("unexpected errors: %v", errors.Join(errs...))
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1 containing %q: %v", len(errs), tt.wantErr, errors.Join(errs...))
			}
			var me *ManifestError
			if !errors.As(errs[0], &me) {
				t.Fatalf("error %T is not a *ManifestError", errs[0])
			}
			if !strings.HasPrefix(errs[0].Error(), tt.wantErr) {
				t.Errorf("got %q, want it to start with %q", errs[0], tt.wantErr)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	pod := mustDecode(t, podWith("  restartPolicy: Sometimes\n  containers:\n  - name: app\n  - name: app\n    image: nginx\n"))
	if errs := Validate(pod); len(errs) != 3 {
		t.Errorf("got %d errors, want 3 (policy, image, duplicate name): %v", len(errs), errors.Join(errs...))
	}
}

// A name or DNS error names the file, line and column of its field.
func TestNamesErrorsLocated(t *testing.T) {
	data := podWith("  hostname: web\n  dnsConfig:\n    nameservers: [10.0.0.1]\n    searches:\n    - ok.example\n    - \"bad example\"\n" + oneContainer)
	res := parseManifest([]byte(data), "pods.yaml", "node1", "file:/x", time.Now(), parseOptions{})
	want := `pods.yaml:11:7: spec.dnsConfig.searches[1]: a lowercase RFC 1123 subdomain`
	if len(res.errs) != 1 || !strings.HasPrefix(res.errs[0].Error(), want) {
		t.Errorf("errors %v, want one starting %q", res.errs, want)
	}
}

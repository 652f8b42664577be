package manifests

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestEphemeralContainers(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{
		Volumes:        []v1.Volume{{Name: "data"}},
		InitContainers: []v1.Container{{Name: "setup", Image: "busybox"}},
		Containers:     []v1.Container{{Name: "app", Image: "busybox"}},
	}}
	ec := func(name string, mod func(*v1.EphemeralContainer)) v1.EphemeralContainer {
		c := v1.EphemeralContainer{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: name, Image: "busybox:1.36"}}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	existing, errs, _ := EphemeralContainers(pod, []v1.EphemeralContainer{ec("dbg", nil)})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if c := existing[0]; c.ImagePullPolicy != v1.PullIfNotPresent || c.TerminationMessagePolicy != v1.TerminationMessageReadFile {
		t.Errorf("not defaulted as a container: %+v", c)
	}
	withDbg := pod.DeepCopy()
	withDbg.Spec.EphemeralContainers = existing
	tests := []struct {
		name string
		pod  *v1.Pod
		in   []v1.EphemeralContainer
		want []string // each in one error; none: valid
	}{
		{"target an init container", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) { c.TargetContainerName = "setup" })}, nil},
		{"added after an existing one", withDbg, []v1.EphemeralContainer{existing[0], ec("d2", nil)}, nil},
		{"forbidden fields", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) {
			c.Ports = []v1.ContainerPort{{ContainerPort: 80}}
			c.ReadinessProbe = &v1.Probe{}
			c.Lifecycle = &v1.Lifecycle{}
			c.VolumeMounts = []v1.VolumeMount{{Name: "data", MountPath: "/d", SubPath: "x"}}
		})}, []string{
			"spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
			"spec.ephemeralContainers[0].readinessProbe: Forbidden",
			"spec.ephemeralContainers[0].lifecycle: Forbidden",
			"spec.ephemeralContainers[0].volumeMounts[0].subPath: Forbidden",
		}},
		{"resources", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) {
			c.Resources.Limits = v1.ResourceList{v1.ResourceCPU: {}}
		})}, []string{"spec.ephemeralContainers[0].resources: Forbidden"}},
		{"name of an app container", pod, []v1.EphemeralContainer{ec("app", nil)}, []string{`spec.ephemeralContainers[0].name: duplicate container name "app"`}},
		{"twice the same name", pod, []v1.EphemeralContainer{ec("d", nil), ec("d", nil)}, []string{`spec.ephemeralContainers[1].name: duplicate container name "d"`}},
		{"unknown target", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) { c.TargetContainerName = "nope" })},
			[]string{`spec.ephemeralContainers[0].targetContainerName: Not found: "nope"`}},
		{"no image, bad name", pod, []v1.EphemeralContainer{ec("D_", func(c *v1.EphemeralContainer) { c.Image = "" })},
			[]string{"spec.ephemeralContainers[0].name:", "spec.ephemeralContainers[0].image: required"}},
		{"unknown volume", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) {
			c.VolumeMounts = []v1.VolumeMount{{Name: "nope", MountPath: "/d"}}
		})}, []string{"spec.ephemeralContainers[0].volumeMounts[0].name"}},
		{"a field noderun refuses", pod, []v1.EphemeralContainer{ec("d", func(c *v1.EphemeralContainer) {
			c.EnvFrom = []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{}}}
		})}, []string{"spec.ephemeralContainers[0].envFrom: static pods may not reference secrets"}},
		{"existing changed", withDbg, []v1.EphemeralContainer{ec("dbg", func(c *v1.EphemeralContainer) { c.Image = "busybox:1.37" })},
			[]string{`spec: existing ephemeral containers "dbg" may not be changed`}},
		{"existing removed", withDbg, []v1.EphemeralContainer{ec("d2", nil)},
			[]string{`spec: existing ephemeral containers "dbg" may not be removed`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs, _ := EphemeralContainers(tt.pod, tt.in)
			var all []string
			for _, err := range errs {
				all = append(all, err.Error())
			}
			got := strings.Join(all, "\n")
			if len(tt.want) == 0 && len(errs) > 0 {
				t.Fatalf("refused: %s", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("errors:\n%s\nwant one with %q", got, w)
				}
			}
		})
	}
}

package runner

import (
	"os"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestProcessUserLikeKubelet(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	yes, no := true, false
	strict, merge, bogus := v1.SupplementalGroupsPolicyStrict, v1.SupplementalGroupsPolicyMerge, v1.SupplementalGroupsPolicy("Loose")
	const ref = `(pod: "web-n1_ns(u1)", container: app)`
	for _, tc := range []struct {
		name      string
		pod       *v1.PodSecurityContext
		container *v1.SecurityContext
		imageUser string
		want      ProcessUser
		wantErr   string
	}{
		{name: "no user is root", want: ProcessUser{User: "0"}},
		{name: "image uid", imageUser: "1000", want: ProcessUser{User: "1000"}},
		{name: "image uid:gid drops the group, as the kubelet does", imageUser: "1000:2000", want: ProcessUser{User: "1000"}},
		{name: "image name", imageUser: "app", want: ProcessUser{User: "app"}},
		{name: "image name:group drops the group", imageUser: "app:staff", want: ProcessUser{User: "app"}},
		{name: "pod runAsUser over image", pod: &v1.PodSecurityContext{RunAsUser: i64(7)}, imageUser: "app", want: ProcessUser{User: "7"}},
		{name: "container over pod", pod: &v1.PodSecurityContext{RunAsUser: i64(7), RunAsGroup: i64(8)},
			container: &v1.SecurityContext{RunAsUser: i64(9)}, want: ProcessUser{User: "9", Group: i64(8)}},
		{name: "runAsGroup alone keeps the image user", container: &v1.SecurityContext{RunAsGroup: i64(8)},
			imageUser: "app:staff", want: ProcessUser{User: "app", Group: i64(8)}},
		{name: "fsGroup then supplementalGroups", pod: &v1.PodSecurityContext{FSGroup: i64(2000), SupplementalGroups: []int64{4000, 50}},
			want: ProcessUser{User: "0", Groups: []int64{2000, 4000, 50}}},
		{name: "Merge", pod: &v1.PodSecurityContext{SupplementalGroupsPolicy: &merge}, want: ProcessUser{User: "0"}},
		{name: "Strict", pod: &v1.PodSecurityContext{SupplementalGroupsPolicy: &strict}, want: ProcessUser{User: "0", Strict: true}},
		{name: "unknown policy", pod: &v1.PodSecurityContext{SupplementalGroupsPolicy: &bogus},
			wantErr: "unsupported supplementalGroupsPolicy: Loose"},

		{name: "nonRoot, root image", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes},
			wantErr: "container has runAsNonRoot and image will run as root " + ref},
		{name: "nonRoot, image uid 0 with group", container: &v1.SecurityContext{RunAsNonRoot: &yes}, imageUser: "0:1000",
			wantErr: "container has runAsNonRoot and image will run as root " + ref},
		{name: "nonRoot, image name", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes}, imageUser: "app:1000",
			wantErr: "container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root " + ref},
		{name: "nonRoot, runAsUser 0", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes}, container: &v1.SecurityContext{RunAsUser: i64(0)},
			imageUser: "1000", wantErr: "container's runAsUser breaks non-root policy " + ref},
		{name: "nonRoot, image uid out of range", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes}, imageUser: "4294967296",
			wantErr: "container has runAsNonRoot and image has an invalid user id (4294967296). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive " + ref},
		{name: "nonRoot, runAsUser 1000 over root image", container: &v1.SecurityContext{RunAsNonRoot: &yes, RunAsUser: i64(1000)},
			want: ProcessUser{User: "1000"}},
		{name: "nonRoot, runAsUser over a named image", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: i64(1000)},
			imageUser: "app", want: ProcessUser{User: "1000"}},
		{name: "nonRoot, image uid", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes}, imageUser: "1000:0", want: ProcessUser{User: "1000"}},
		{name: "container turns nonRoot off", pod: &v1.PodSecurityContext{RunAsNonRoot: &yes},
			container: &v1.SecurityContext{RunAsNonRoot: &no}, want: ProcessUser{User: "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-n1", Namespace: "ns", UID: "u1"},
				Spec: v1.PodSpec{SecurityContext: tc.pod}}
			c := &v1.Container{Name: "app", SecurityContext: tc.container}
			got, err := processUser(pod, c, ImageConfig{User: tc.imageUser})
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v\nwant %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("user = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestHostnameEnvPrecedence: the runtime's HOSTNAME comes first, the image's
// env and then the container's can override it, as with containerd's CRI.
func TestHostnameEnvPrecedence(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-n1"}, Spec: v1.PodSpec{Hostname: "web"}}
	base := []string{"HOSTNAME=" + utsHostname(pod)}
	for _, tc := range []struct {
		name  string
		image []string
		env   []envVar
		want  []string
	}{
		{"set", []string{"PATH=/bin"}, nil, []string{"HOSTNAME=web", "PATH=/bin"}},
		{"image overrides", []string{"PATH=/bin", "HOSTNAME=img"}, nil, []string{"HOSTNAME=img", "PATH=/bin"}},
		{"container overrides", []string{"HOSTNAME=img"}, []envVar{{"HOSTNAME", "mine"}}, []string{"HOSTNAME=mine"}},
	} {
		if got := mergeEnv(append(slices.Clone(base), tc.image...), tc.env); !slices.Equal(got, tc.want) {
			t.Errorf("%s: env %q, want %q", tc.name, got, tc.want)
		}
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.HostNetwork = true
	if got := utsHostname(pod); got != host {
		t.Errorf("hostNetwork pod hostname = %q, want the node's %q", got, host)
	}
}

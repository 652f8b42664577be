package runner

import (
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/noderun/noderun/internal/expansion"
)

// containerConfig resolves a container's Kubernetes semantics (env, args,
// volumes, pod files) into what the runtime needs.
func (w *podWorker) containerConfig(pod *v1.Pod, c *v1.Container, init bool, img ImageConfig, restart int, last *v1.ContainerStateTerminated) (*ContainerConfig, error) {
	env, err := containerEnv(pod, c, w.podStateDir(), w.st.ips, w.env.cfg.HostIP, w.env.objects)
	if err != nil {
		return nil, err
	}
	user, err := processUser(pod, c, img)
	if err != nil {
		return nil, err
	}
	// The kubelet checks the FQDN for every container, hostNetwork too.
	if _, err := kernelHostname(pod); err != nil {
		return nil, err
	}
	mounts, err := w.containerMounts(pod, c, env)
	if err != nil {
		return nil, err
	}
	if c.TerminationMessagePath != "" {
		// A file of its own per run, bound where the container writes its
		// termination message, as the kubelet does.
		path, err := w.newMessageFile(c.Name, restart)
		if err != nil {
			return nil, fmt.Errorf("termination message file: %w", err)
		}
		mounts = append(mounts, Mount{Source: path, Destination: c.TerminationMessagePath})
	}
	wd := c.WorkingDir
	if wd == "" {
		wd = img.WorkingDir
	}
	return &ContainerConfig{
		ID:           ContainerID(string(pod.UID), c.Name, restart),
		Pod:          pod,
		Container:    c,
		Init:         init,
		Image:        img,
		Args:         containerArgs(c, img, env),
		Env:          mergeEnv(append([]string{"HOSTNAME=" + utsHostname(pod)}, img.Env...), env),
		User:         user,
		WorkingDir:   wd,
		Mounts:       mounts,
		Sandbox:      w.sandbox(pod),
		CgroupParent: w.cgroupParent(pod),
		Resources:    w.containerResources(pod, c),
		OOMScoreAdj:  oomScoreAdj(pod, c, w.env.cfg.MemoryCapacity),
		LogPath:      filepath.Join(w.podLogDir(pod), c.Name, strconv.Itoa(restart)+".log"),
		RestartCount: restart,
		SpecHash:     specHash(c),
		LastState:    last,
	}, nil
}

// envVar is one resolved container variable, in declaration order.
type envVar struct{ name, value string }

// containerEnv resolves the container's envFrom, then its env list in
// order; $(VAR) refers to variables from envFrom and to those declared
// earlier in the list, as in Kubernetes. ConfigMaps and Secrets come from
// objs, read now: a change shows at the next start, as with the kubelet;
// fileKeyRef files come from the pod's emptyDirs under podDir.
func containerEnv(pod *v1.Pod, c *v1.Container, podDir string, podIPs []string, hostIP string, objs *configObjects) ([]envVar, error) {
	out, err := objs.envFrom(pod, c)
	if err != nil {
		return nil, err
	}
	defined := map[string]string{}
	for _, ev := range out {
		defined[ev.name] = ev.value
	}
	for _, ev := range c.Env {
		var val string
		switch {
		case ev.ValueFrom == nil:
			val = expansion.Expand(ev.Value, func(n string) (string, bool) { v, ok := defined[n]; return v, ok })
		case ev.ValueFrom.FieldRef != nil:
			v, err := fieldRefValue(pod, ev.ValueFrom.FieldRef.FieldPath, podIPs, hostIP)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", ev.Name, err)
			}
			val = v
		case ev.ValueFrom.ResourceFieldRef != nil:
			v, err := resourceFieldValue(pod, c, ev.ValueFrom.ResourceFieldRef)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", ev.Name, err)
			}
			val = v
		case ev.ValueFrom.ConfigMapKeyRef != nil || ev.ValueFrom.SecretKeyRef != nil:
			// The kubelet's own messages, unwrapped: they are the
			// container's CreateContainerConfigError.
			v, ok, err := objs.keyRef(pod, ev.ValueFrom)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			val = v
		case ev.ValueFrom.FileKeyRef != nil:
			v, skip, err := fileKeyValue(podDir, ev.ValueFrom.FileKeyRef)
			if err != nil {
				return nil, err
			}
			if skip {
				continue
			}
			val = v
		default:
			return nil, fmt.Errorf("env %s: unsupported value source", ev.Name)
		}
		defined[ev.Name] = val
		out = append(out, envVar{ev.Name, val})
	}
	return out, nil
}

// mergeEnv puts container variables over the base list (the runtime's
// HOSTNAME, then the image's), each later value replacing an earlier one in
// place, as containerd's oci.WithEnv does.
func mergeEnv(base []string, env []envVar) []string {
	out := make([]string, 0, len(base)+len(env))
	index := map[string]int{}
	set := func(name, kv string) {
		if i, ok := index[name]; ok {
			out[i] = kv
			return
		}
		index[name] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		set(name, kv)
	}
	for _, ev := range env {
		set(ev.name, ev.name+"="+ev.value)
	}
	return out
}

// containerArgs merges command/args with the image's Entrypoint/Cmd exactly
// as Kubernetes does, then expands $(VAR) references.
func containerArgs(c *v1.Container, img ImageConfig, env []envVar) []string {
	var args []string
	switch {
	case len(c.Command) > 0:
		args = append(append(args, c.Command...), c.Args...)
	case len(c.Args) > 0:
		args = append(append(args, img.Entrypoint...), c.Args...)
	default:
		args = append(append(args, img.Entrypoint...), img.Cmd...)
	}
	vars := map[string]string{}
	for _, ev := range env {
		vars[ev.name] = ev.value
	}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for i := range args {
		// Only what the user wrote is expanded, not the image's defaults.
		if len(c.Command) > 0 || (len(c.Args) > 0 && i >= len(img.Entrypoint)) {
			args[i] = expansion.Expand(args[i], lookup)
		}
	}
	return args
}

// fieldRefValue answers the downward API's fieldRef paths.
func fieldRefValue(pod *v1.Pod, path string, podIPs []string, hostIP string) (string, error) {
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	case "status.podIP":
		if pod.Spec.HostNetwork {
			return hostIP, nil
		}
		if len(podIPs) > 0 {
			return podIPs[0], nil
		}
		return "", nil
	case "status.podIPs":
		if pod.Spec.HostNetwork {
			return hostIP, nil
		}
		return strings.Join(podIPs, ","), nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// resourceFieldValue answers resourceFieldRef; an unset limit reports the
// pod-level limit, else the node's capacity, as the kubelet does.
func resourceFieldValue(pod *v1.Pod, c *v1.Container, ref *v1.ResourceFieldSelector) (string, error) {
	if c == nil || ref.ContainerName != "" {
		for _, o := range allContainers(pod) {
			if o.Name == ref.ContainerName {
				c = o
			}
		}
	}
	if c == nil {
		return "", fmt.Errorf("resourceFieldRef %s: no container %q", ref.Resource, ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("unsupported resource %q", ref.Resource)
	}
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	}
	q, ok := list[v1.ResourceName(name)]
	if !ok {
		q = nodeCapacity(v1.ResourceName(name))
		if r := pod.Spec.Resources; kind == "limits" && r != nil && !r.Limits.Name(v1.ResourceName(name), resource.DecimalSI).IsZero() {
			q = r.Limits[v1.ResourceName(name)] // as the kubelet: the pod-level limit before the node's
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if name == string(v1.ResourceCPU) {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

func nodeCapacity(name v1.ResourceName) resource.Quantity {
	switch name {
	case v1.ResourceCPU:
		return *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
	case v1.ResourceMemory:
		return *resource.NewQuantity(memTotal(), resource.BinarySI)
	}
	return resource.Quantity{}
}

package kubeapi

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	apiversion "k8s.io/apimachinery/pkg/version"
)

// kubeVersion is the Kubernetes release whose API noderun's k8s.io/api
// module describes (k8s.io/api v0.X.Y is Kubernetes v1.X.Y): kubectl checks
// its skew against it.
func kubeVersion() *version.Version {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path != "k8s.io/api" {
				continue
			}
			if v, err := version.ParseSemantic(d.Version); err == nil && v.Major() == 0 {
				return version.MajorMinor(1, v.Minor()).WithPatch(v.Patch())
			}
		}
	}
	return version.MajorMinor(1, 0) // a test binary without module data
}

// KubeletVersion is the kubelet release whose behaviour noderun keeps
// (v1.X.Y, from its k8s.io/api module), for what judges a node by its
// kubelet's version: mirror mode's Node, which kubeadm's skew checks read.
func KubeletVersion() string { return "v" + kubeVersion().String() }

// Semver turns noderun's version (a tag, `git describe` output or "dev")
// into a valid semantic version: v1.2.3 stays, anything else becomes a
// pre-release of v0.0.0 (v0.0.0-3037c00-dirty).
func Semver(v string) string {
	if sv, err := version.ParseSemantic(v); err == nil {
		return "v" + sv.String()
	}
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.TrimPrefix(v, "v"))
	clean = strings.Trim(strings.ReplaceAll(clean, "..", "."), ".-")
	if clean == "" {
		clean = "unknown"
	}
	return "v0.0.0-" + clean
}

func (s *Server) serveVersion(w http.ResponseWriter, _ *http.Request) {
	kv := kubeVersion()
	writeJSON(w, http.StatusOK, &apiversion.Info{
		Major: "1", Minor: strconv.Itoa(int(kv.Minor())),
		// The Kubernetes version whose API is served, with noderun's own
		// as build metadata: valid semver, and no skew warning in kubectl.
		GitVersion:   "v" + kv.String() + "+noderun." + strings.TrimPrefix(Semver(s.version), "v"),
		GitTreeState: "clean",
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	})
}

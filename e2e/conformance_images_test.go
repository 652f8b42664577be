package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/noderun/noderun/internal/ociimage"
)

// nginxScript stands in for nginx: it serves /usr/share/nginx/html on :80
// with busybox httpd; SIGQUIT (the image's stop signal, as nginx's) makes it
// exit gracefully, and `nginx -s quit` sends that to the running one. It
// says which of the two ended it.
const nginxScript = `#!/bin/sh
if [ "$1" = "-s" ]; then
	touch /run/nginx.quit
	kill -QUIT "$(cat /run/nginx.pid)"
	exit
fi
echo $$ > /run/nginx.pid
quit() {
	if [ -e /run/nginx.quit ]; then echo "nginx: quit by nginx -s quit"; else echo "nginx: SIGQUIT from the runtime"; fi
	kill $httpd
	exit 0
}
trap quit QUIT
trap 'echo "nginx: SIGTERM"; kill $httpd; exit 0' TERM
httpd -f -p 80 -h /usr/share/nginx/html &
httpd=$!
echo "nginx: started"
while :; do wait; done
`

var conformanceImage builtImage

// conformanceTar holds the images the real-world manifests name, except
// etcd (etcdTar) and busybox (the harness's).
func conformanceTar(t *testing.T) string {
	return conformanceImage.get(t, func() (string, error) {
		var imgs []ociimage.Image
		for _, name := range []string{"docker.io/library/nginx:latest", "docker.io/library/nginx:1.29"} {
			img, err := ociimage.Busybox(name)
			if err != nil {
				return "", err
			}
			img.Files["/usr/sbin/nginx"] = ociimage.Regular([]byte(nginxScript), 0o755)
			img.Files["/usr/share/nginx/html"] = ociimage.Dir(0o755)
			img.Files["/usr/share/nginx/html/index.html"] = ociimage.Regular([]byte("Welcome to nginx!\n"), 0o644)
			img.Files["/run"] = ociimage.Dir(0o755)
			img.Env = append(img.Env, "NGINX_VERSION=stand-in")
			img.Cmd = []string{"nginx", "-g", "daemon off;"}
			img.StopSignal = "SIGQUIT" // as the nginx image has it
			imgs = append(imgs, img)
		}
		proxy, err := ociimage.Busybox("registry.k8s.io/goproxy:0.1")
		if err != nil {
			return "", err
		}
		proxy.Cmd = []string{"httpd", "-f", "-p", "8080", "-h", "/var/www"}
		imgs = append(imgs, proxy)
		path := filepath.Join(workDir, "conformance.tar")
		return path, ociimage.WriteFile(path, imgs...)
	})
}

var etcdImage builtImage

// etcdVersion is the etcd the kubeadm manifest names.
const etcdVersion = "v3.5.15"

// etcdTar is busybox plus a real etcd, built from the Go module proxy
// (there is no etcd package in Debian 12) into the Go build cache, so
// only the first run on a machine pays for it.
func etcdTar(t *testing.T) string {
	return etcdImage.get(t, func() (string, error) {
		mod := filepath.Join(workDir, "etcd-build")
		if err := os.MkdirAll(mod, 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module etcdbuild\n\ngo 1.22\n"), 0o644); err != nil {
			return "", err
		}
		bin := filepath.Join(workDir, "etcd")
		for _, args := range [][]string{
			{"get", "go.etcd.io/etcd/server/v3@" + etcdVersion},
			{"build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "go.etcd.io/etcd/server/v3"},
		} {
			cmd := exec.Command("go", args...)
			cmd.Dir = mod
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				return "", fmt.Errorf("go %v: %w\n%s", args, err, out)
			}
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			return "", err
		}
		img, err := ociimage.Busybox("registry.k8s.io/etcd:3.5.15-0")
		if err != nil {
			return "", err
		}
		img.Files["/usr/local/bin"] = ociimage.Dir(0o755)
		img.Files["/usr/local/bin/etcd"] = ociimage.Regular(b, 0o755)
		path := filepath.Join(workDir, "etcd.tar")
		return path, ociimage.WriteFile(path, img)
	})
}

// Command mkimage writes busybox OCI image tarballs for examples and tests:
//
//	mkimage -o examples/images/busybox.tar -name docker.io/library/busybox:1.36 [-name other...]
//
// Every name is the same busybox image; they share one tarball.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/noderun/noderun/internal/ociimage"
)

type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

func main() {
	out := flag.String("o", "", "output tarball")
	var imageNames names
	flag.Var(&imageNames, "name", "image name (repeatable)")
	flag.Parse()
	if *out == "" || len(imageNames) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, imageNames); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out string, imageNames []string) error {
	var imgs []ociimage.Image
	for _, name := range imageNames {
		img, err := ociimage.Busybox(name)
		if err != nil {
			return err
		}
		imgs = append(imgs, img)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return ociimage.WriteFile(out, imgs...)
}

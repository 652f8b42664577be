// Package ociimage builds small single-layer OCI image layout tarballs from
// host files, offline, so examples and tests need no registry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// annotationImageName is containerd's index annotation holding the full
// image name; containerd's Import prefers it over the OCI ref name, which is
// only a tag.
const annotationImageName = "io.containerd.image.name"

// epoch is every file's mtime so equal input gives equal digests.
var epoch = time.Unix(0, 0).UTC()

// File is one entry of the image's filesystem.
type File struct {
	Content []byte
	Mode    fs.FileMode // permissions, plus fs.ModeDir or fs.ModeSymlink
	Link    string      // symlink target
}

// Regular returns a regular file.
func Regular(content []byte, perm fs.FileMode) File { return File{Content: content, Mode: perm} }

// Dir returns a directory.
func Dir(perm fs.FileMode) File { return File{Mode: fs.ModeDir | perm} }

// Symlink returns a symbolic link to target.
func Symlink(target string) File { return File{Mode: fs.ModeSymlink | 0o777, Link: target} }

// Image describes a single-layer image. Name is normalized like Kubernetes
// does ("busybox" becomes "docker.io/library/busybox:latest").
type Image struct {
	Name       string
	Files      map[string]File // absolute path in the image -> entry
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
	StopSignal string
}

// WriteTar writes img as an OCI image layout tarball.
func (img Image) WriteTar(w io.Writer) error {
	return writeLayout(w, []Image{img})
}

// WriteFile writes all imgs into one OCI image layout tarball at path. It
// writes a dot-file first and renames it, so directory watchers (which skip
// dot-files) never see a partial archive.
func WriteFile(path string, imgs ...Image) (retErr error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			os.Remove(tmp.Name())
		}
	}()
	if err := writeLayout(tmp, imgs); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// layout collects content-addressed blobs; images sharing content share blobs.
type layout struct {
	blobs map[digest.Digest][]byte
	index ocispec.Index
}

func writeLayout(w io.Writer, imgs []Image) error {
	l := &layout{
		blobs: map[digest.Digest][]byte{},
		index: ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex},
	}
	for _, img := range imgs {
		if err := l.add(img); err != nil {
			return fmt.Errorf("image %q: %w", img.Name, err)
		}
	}
	return l.write(w)
}

func (l *layout) add(img Image) error {
	named, err := reference.ParseDockerRef(img.Name)
	if err != nil {
		return err
	}
	layerTar, err := layerTar(img.Files)
	if err != nil {
		return err
	}
	layerGz, err := gzipBytes(layerTar)
	if err != nil {
		return err
	}
	layer := l.blob(ocispec.MediaTypeImageLayerGzip, layerGz)
	platform := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	config, err := l.jsonBlob(ocispec.MediaTypeImageConfig, imageConfig(img, platform, digest.FromBytes(layerTar)))
	if err != nil {
		return err
	}
	manifest, err := l.jsonBlob(ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config,
		Layers:    []ocispec.Descriptor{layer},
	})
	if err != nil {
		return err
	}
	manifest.Platform = &platform
	manifest.Annotations = map[string]string{
		annotationImageName:       named.String(),
		ocispec.AnnotationRefName: refName(named),
	}
	l.index.Manifests = append(l.index.Manifests, manifest)
	return nil
}

// refName is the OCI ref name as containerd's exporter writes it: the tag
// (or digest) only, the repository living in annotationImageName.
func refName(named reference.Named) string {
	if t, ok := named.(reference.Tagged); ok {
		return t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		return d.Digest().String()
	}
	return named.String()
}

func imageConfig(img Image, platform ocispec.Platform, diffID digest.Digest) ocispec.Image {
	return ocispec.Image{
		Created:  &epoch,
		Platform: platform,
		Config: ocispec.ImageConfig{
			User:       img.User,
			Env:        img.Env,
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			WorkingDir: img.WorkingDir,
			StopSignal: img.StopSignal,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
}

func (l *layout) blob(mediaType string, data []byte) ocispec.Descriptor {
	d := digest.FromBytes(data)
	l.blobs[d] = data
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

func (l *layout) jsonBlob(mediaType string, v any) (ocispec.Descriptor, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return l.blob(mediaType, data), nil
}

func (l *layout) write(w io.Writer) error {
	tw := tar.NewWriter(w)
	index, err := json.Marshal(l.index)
	if err != nil {
		return err
	}
	ociLayout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}
	if err := writeEntry(tw, "oci-layout", Regular(ociLayout, 0o644)); err != nil {
		return err
	}
	if err := writeEntry(tw, "index.json", Regular(index, 0o644)); err != nil {
		return err
	}
	for _, dir := range []string{"blobs", "blobs/sha256"} {
		if err := writeEntry(tw, dir, Dir(0o755)); err != nil {
			return err
		}
	}
	for _, d := range slices.Sorted(maps.Keys(l.blobs)) {
		if err := writeEntry(tw, "blobs/sha256/"+d.Encoded(), Regular(l.blobs[d], 0o644)); err != nil {
			return err
		}
	}
	return tw.Close()
}

// layerTar is the uncompressed layer: every file sorted by path, with any
// missing parent directories added.
func layerTar(files map[string]File) ([]byte, error) {
	all := map[string]File{}
	for p, f := range files {
		clean := strings.TrimPrefix(path.Clean("/"+p), "/")
		if clean == "" {
			return nil, fmt.Errorf("invalid path %q", p)
		}
		all[clean] = f
		for dir := path.Dir(clean); dir != "."; dir = path.Dir(dir) {
			if _, ok := all[dir]; !ok {
				all[dir] = Dir(0o755)
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(all)) {
		if err := writeEntry(tw, p, all[p]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, name string, f File) error {
	hdr := &tar.Header{Name: name, Mode: tarMode(f.Mode), ModTime: epoch}
	switch {
	case f.Mode&fs.ModeDir != 0:
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
	case f.Mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Content))
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	_, err := tw.Write(f.Content)
	return err
}

// tarMode converts Go's mode bits to the Unix bits tar stores.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func gzipBytes(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	// No name or mtime in the header keeps the output deterministic.
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/noderun/noderun/internal/testenv"
)

// readTar returns every entry of a tar stream by name.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[hdr.Name], data[hdr.Name] = hdr, b
	}
}

func unmarshalBlob(t *testing.T, blobs map[string][]byte, d digest.Digest, v any) {
	t.Helper()
	b, ok := blobs["blobs/sha256/"+d.Encoded()]
	if !ok {
		t.Fatalf("blob %s missing", d)
	}
	if digest.FromBytes(b) != d {
		t.Fatalf("blob %s has wrong digest", d)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func testImage() Image {
	return Image{
		Name: "example",
		Files: map[string]File{
			"/usr/bin/tool":  Regular([]byte("#!/bin/sh\n"), 0o755),
			"/usr/bin/alias": Symlink("tool"),
			"/tmp":           Dir(0o777 | fs.ModeSticky),
		},
		Entrypoint: []string{"/usr/bin/tool"},
		Cmd:        []string{"--flag"},
		Env:        []string{"A=1"},
		WorkingDir: "/tmp",
		User:       "65534",
		StopSignal: "SIGINT",
	}
}

func TestWriteTar(t *testing.T) {
	var buf bytes.Buffer
	if err := testImage().WriteTar(&buf); err != nil {
		t.Fatal(err)
	}
	_, files := readTar(t, &buf)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout = %s", files["oci-layout"])
	}
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(index.Manifests))
	}
	m := index.Manifests[0]
	if got := m.Annotations[annotationImageName]; got != "docker.io/library/example:latest" {
		t.Errorf("image name = %q", got)
	}
	if got := m.Annotations[ocispec.AnnotationRefName]; got != "latest" {
		t.Errorf("ref name = %q", got)
	}
	var manifest ocispec.Manifest
	unmarshalBlob(t, files, m.Digest, &manifest)
	var config ocispec.Image
	unmarshalBlob(t, files, manifest.Config.Digest, &config)
	want := testImage()
	c := config.Config
	if c.Entrypoint[0] != want.Entrypoint[0] || c.Cmd[0] != want.Cmd[0] || c.Env[0] != want.Env[0] ||
		c.WorkingDir != want.WorkingDir || c.User != want.User || c.StopSignal != want.StopSignal {
		t.Errorf("config = %+v", c)
	}

	if len(manifest.Layers) != 1 {
		t.Fatalf("manifest has %d layers", len(manifest.Layers))
	}
	layerGz := files["blobs/sha256/"+manifest.Layers[0].Digest.Encoded()]
	zr, err := gzip.NewReader(bytes.NewReader(layerGz))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if config.RootFS.DiffIDs[0] != digest.FromBytes(layer) {
		t.Errorf("diff_id does not match the uncompressed layer")
	}
	checkLayer(t, layer)
}

func checkLayer(t *testing.T, layer []byte) {
	t.Helper()
	hdrs, data := readTar(t, bytes.NewReader(layer))
	tests := []struct {
		name     string
		typeflag byte
		mode     int64
	}{
		{"usr/", tar.TypeDir, 0o755},
		{"usr/bin/", tar.TypeDir, 0o755},
		{"usr/bin/tool", tar.TypeReg, 0o755},
		{"usr/bin/alias", tar.TypeSymlink, 0o777},
		{"tmp/", tar.TypeDir, 0o1777},
	}
	if len(hdrs) != len(tests) {
		t.Errorf("layer has %d entries, want %d", len(hdrs), len(tests))
	}
	for _, tt := range tests {
		h, ok := hdrs[tt.name]
		if !ok {
			t.Errorf("%s missing", tt.name)
			continue
		}
		if h.Typeflag != tt.typeflag || h.Mode != tt.mode || h.Uid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: type %c mode %o uid %d mtime %v", tt.name, h.Typeflag, h.Mode, h.Uid, h.ModTime)
		}
	}
	if hdrs["usr/bin/alias"].Linkname != "tool" || string(data["usr/bin/tool"]) != "#!/bin/sh\n" {
		t.Errorf("wrong symlink target or content")
	}
}

func TestWriteTarDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := testImage().WriteTar(&a); err != nil {
		t.Fatal(err)
	}
	if err := testImage().WriteTar(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("same image gave different tarballs")
	}
}

func TestWriteTarBadName(t *testing.T) {
	img := testImage()
	img.Name = "Not A Name"
	if err := img.WriteTar(io.Discard); err == nil {
		t.Fatal("want error for invalid name")
	}
}

func TestWriteFileSharesBlobs(t *testing.T) {
	one, two := testImage(), testImage()
	two.Name = "registry.example:5000/other:v2"
	path := filepath.Join(t.TempDir(), "images.tar")
	if err := WriteFile(path, one, two); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, files := readTar(t, f)
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 2 || index.Manifests[1].Annotations[annotationImageName] != "registry.example:5000/other:v2" {
		t.Fatalf("index = %+v", index)
	}
	if len(files) != 7 { // oci-layout, index.json, 2 dirs, 3 shared blobs
		t.Errorf("tarball has %d entries, want 7", len(files))
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary file left behind: %v", entries)
	}
}

// requireBusybox skips (or under CI=true fails) when the host lacks busybox-static.
func requireBusybox(t *testing.T) {
	t.Helper()
	_, err := readStatic(BusyboxPath)
	testenv.Require(t, err == nil, "static busybox at "+BusyboxPath)
}

func TestBusybox(t *testing.T) {
	requireBusybox(t)
	img, err := Busybox("busybox:1.36")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/bin/sh", "/bin/sleep", "/bin/httpd", "/bin/wget", "/bin/id"} {
		if f, ok := img.Files[p]; !ok || f.Link != "busybox" {
			t.Errorf("%s = %+v, want symlink to busybox", p, f)
		}
	}
	if f, ok := img.Files["/bin/printenv"]; !ok || (f.Link != "busybox" && !strings.HasPrefix(string(f.Content), "#!/bin/sh")) {
		t.Errorf("/bin/printenv = %+v, want the applet or the stand-in script", f)
	}
	if f := img.Files["/tmp"]; f.Mode != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Errorf("/tmp mode = %v", f.Mode)
	}
	if len(img.Cmd) != 1 || img.Cmd[0] != "sh" || img.Env[0] != defaultPath {
		t.Errorf("config = %v %v", img.Cmd, img.Env)
	}
}

func TestReadStaticRejectsDynamic(t *testing.T) {
	if _, err := readStatic("/nonexistent/busybox"); !errors.Is(err, ErrNoStaticBusybox) {
		t.Fatalf("missing binary: err = %v, want ErrNoStaticBusybox", err)
	}
	for _, p := range []string{"/bin/ls", "/usr/bin/ls"} {
		if _, err := os.Stat(p); err == nil {
			if _, err := readStatic(p); !errors.Is(err, ErrNoStaticBusybox) {
				t.Fatalf("readStatic(%s) = %v, want ErrNoStaticBusybox", p, err)
			}
			return
		}
	}
	t.Skip("no dynamically linked ls to test with")
}

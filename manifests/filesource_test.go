package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
)

// wait bounds every wait for a snapshot: it only tells a hang from a busy
// machine (or qemu), so it is far longer than any snapshot should take.
const wait = 30 * time.Second

func manifest(name, image string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n  containers:\n  - name: c\n    image: %s\n", name, image)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startSource runs a FileSource on path until the test ends. Relisting is
// off unless opts turn it on, so tests see the effect of events alone.
func startSource(t *testing.T, path string, opts ...FileOption) <-chan Snapshot {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Snapshot)
	done := make(chan error, 1)
	opts = append([]FileOption{WithRelistInterval(time.Hour), WithDebounce(50 * time.Millisecond), WithWriteSettle(time.Millisecond)}, opts...)
	s := NewFileSource(path, "node1", opts...)
	go func() { done <- s.Run(ctx, out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return out
}

func next(t *testing.T, ch <-chan Snapshot) Snapshot {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(wait):
		t.Fatal("no snapshot")
		return Snapshot{}
	}
}

// summary renders a snapshot as "name image" lines, then error lines.
func summary(s Snapshot) string {
	var b strings.Builder
	for _, p := range s.Pods {
		fmt.Fprintf(&b, "%s %s\n", p.Name, p.Spec.Containers[0].Image)
	}
	for _, err := range s.Errors {
		fmt.Fprintf(&b, "error %s\n", err)
	}
	return b.String()
}

func expect(t *testing.T, s Snapshot, want string) {
	t.Helper()
	if got := summary(s); got != want {
		t.Errorf("snapshot:\n%s\nwant:\n%s", got, want)
	}
}

// barrier proves that no snapshot is pending: it adds a marker pod and
// requires the very next snapshot to be want plus that pod.
func barrier(t *testing.T, dir string, ch <-chan Snapshot, want string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "zz-marker.yaml"), manifest("marker", "busybox"))
	expect(t, next(t, ch), want+"marker-node1 busybox\n")
}

func TestFileSourceInitialSnapshot(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.yml"), manifest("b", "nginx:1"))
	writeFile(t, filepath.Join(dir, "a.yaml"), manifest("a", "nginx:1")+"---\n"+manifest("a2", "nginx:2"))
	writeFile(t, filepath.Join(dir, "c.json"), `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"nginx:3"}]}}`)
	writeFile(t, filepath.Join(dir, "d-bad.yaml"), manifest("d", "nginx")+"---\n"+strings.Replace(manifest("e", "nginx"), "image", "imag", 1))
	// Anything below would be an error if it were read.
	for _, name := range []string{".hidden.yaml", "web.yaml.swp", ".web.yaml.swp", "web.yaml~", "4913", "web.yaml.bak",
		"web.yaml.orig", "web.yaml.dpkg-new", "web.dpkg-old.yaml", "web.yaml.tmp", "README.md"} {
		writeFile(t, filepath.Join(dir, name), "not: [a manifest")
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sub.yaml", "x.yaml"), "not: [a manifest")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "b.yml"), filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}

	s := next(t, startSource(t, dir))
	expect(t, s, "a-node1 nginx:1\na2-node1 nginx:2\nb-node1 nginx:1\nc-node1 nginx:3\nd-node1 nginx\n"+
		"error "+filepath.Join(dir, "d-bad.yaml")+":17:5: spec.containers[0].imag: unknown field\n"+
		"error "+filepath.Join(dir, "link.yaml")+":1: metadata.name: pod default/b-node1 is already defined in "+filepath.Join(dir, "b.yml")+":1\n")
	if s.Source != "file:"+dir {
		t.Errorf("Source = %q", s.Source)
	}
	for _, err := range s.Errors {
		var me *ManifestError
		if !errors.As(err, &me) {
			t.Errorf("%v is not a *ManifestError", err)
		}
	}
	p := s.Pods[0]
	if p.Namespace != "default" || p.Spec.NodeName != "node1" || p.Spec.RestartPolicy != v1.RestartPolicyAlways ||
		p.Annotations[ConfigHashAnnotation] != string(p.UID) {
		t.Errorf("pod not identified and defaulted: %+v", p)
	}
}

func TestFileSourceChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), manifest("a", "nginx:1"))
	ch := startSource(t, dir)
	first := next(t, ch)
	expect(t, first, "a-node1 nginx:1\n")

	writeFile(t, filepath.Join(dir, "b.yaml"), manifest("b", "nginx:1"))
	added := next(t, ch)
	expect(t, added, "a-node1 nginx:1\nb-node1 nginx:1\n")
	if added.Pods[0] != first.Pods[0] {
		t.Error("an unchanged file's pod was rebuilt")
	}

	writeFile(t, filepath.Join(dir, "a.yaml"), manifest("a", "nginx:2"))
	modified := next(t, ch)
	expect(t, modified, "a-node1 nginx:2\nb-node1 nginx:1\n")
	if modified.Pods[0].UID == first.Pods[0].UID {
		t.Error("an edited manifest kept its UID")
	}

	// Broken: a keeps its last good spec (see TestFileSourceLastKnownGood).
	writeFile(t, filepath.Join(dir, "a.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: a\n")
	expect(t, next(t, ch), "a-node1 nginx:2\nb-node1 nginx:1\nerror "+filepath.Join(dir, "a.yaml")+":3: invalid YAML: line 3: did not find expected ',' or '}'\n")

	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "b-node1 nginx:1\n")
	barrier(t, dir, ch, "b-node1 nginx:1\n")
}

func TestFileSourceCopyThenRename(t *testing.T) {
	dir := t.TempDir()
	ch := startSource(t, dir)
	expect(t, next(t, ch), "")

	tmp := filepath.Join(dir, ".web.yaml.tmp")
	writeFile(t, tmp, manifest("web", "nginx:1"))
	if err := os.Rename(tmp, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "web-node1 nginx:1\n")
	barrier(t, dir, ch, "web-node1 nginx:1\n")
}

// An editor's save dance (vim with backupcopy=no) passes through states with
// no web.yaml at all; the debounce hides them.
func TestFileSourceEditorSave(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, manifest("web", "nginx:1"))
	ch := startSource(t, dir, WithDebounce(200*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	writeFile(t, filepath.Join(dir, "4913"), "")
	os.Remove(filepath.Join(dir, "4913"))
	if err := os.Rename(web, web+"~"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(web)
	if err != nil {
		t.Fatal(err)
	}
	// One write: a writer held up between two for longer than the
	// debounce would rightly have its half-written file read.
	f.WriteString(manifest("web", "nginx:2"))
	f.Close()
	os.Remove(web + "~")

	expect(t, next(t, ch), "web-node1 nginx:2\n")
	barrier(t, dir, ch, "web-node1 nginx:2\n")
}

func TestFileSourceMissingDirectoryAppears(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "etc", "noderun", "pods")
	ch := startSource(t, dir)
	expect(t, next(t, ch), "")

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "web.yaml"), manifest("web", "nginx:1"))
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	// Removing the directory removes its pods; recreating it is seen again.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "web.yaml"), manifest("web", "nginx:2"))
	expect(t, next(t, ch), "web-node1 nginx:2\n")
}

func TestFileSourceDuplicates(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	writeFile(t, a, manifest("web", "nginx:a"))
	writeFile(t, b, "# the same pod again\n"+manifest("web", "nginx:b")+"---\n"+manifest("web", "nginx:b2"))
	ch := startSource(t, dir)
	expect(t, next(t, ch), "web-node1 nginx:a\n"+
		"error "+b+":2: metadata.name: pod default/web-node1 is already defined in "+a+":1\n"+
		"error "+b+":11: metadata.name: pod default/web-node1 is already defined in "+a+":1\n")

	// Once a.yaml is gone, b.yaml's first document wins.
	os.Remove(a)
	expect(t, next(t, ch), "web-node1 nginx:b\n"+
		"error "+b+":11: metadata.name: pod default/web-node1 is already defined in "+b+":2\n")
}

func TestFileSourceSingleFile(t *testing.T) {
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod.conf") // any name will do for an explicit file
	writeFile(t, pod, manifest("web", "nginx:1"))
	ch := startSource(t, pod)
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	writeFile(t, filepath.Join(dir, "other.yaml"), manifest("other", "nginx:1"))
	writeFile(t, pod, manifest("web", "nginx:2"))
	expect(t, next(t, ch), "web-node1 nginx:2\n")
	os.Remove(pod)
	expect(t, next(t, ch), "")
}

// Symlink targets outside the directory produce no events there; the
// periodic relist still sees them change.
func TestFileSourceRelistSeesSymlinkTarget(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "web.yaml")
	writeFile(t, target, manifest("web", "nginx:1"))
	if err := os.Symlink(target, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	ch := startSource(t, dir, WithRelistInterval(50*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")
	writeFile(t, target, manifest("web", "nginx:2"))
	expect(t, next(t, ch), "web-node1 nginx:2\n")
}

func TestFileSourceTooLarge(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, manifest("big", "nginx")+"# "+strings.Repeat("x", MaxFileSize)+"\n")
	writeFile(t, filepath.Join(dir, "ok.yaml"), manifest("ok", "nginx"))
	s := next(t, startSource(t, dir))
	expect(t, s, "ok-node1 nginx\nerror "+big+": manifest file is larger than 10 MiB\n")
	if !errors.Is(s.Errors[0], ErrTooLarge) {
		t.Errorf("%v is not ErrTooLarge", s.Errors[0])
	}
}

// A relist that finds nothing new must send nothing and keep the pods, with
// their config.seen, as they were.
func TestRelistUnchangedSendsNothing(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), manifest("web", "nginx"))
	writeFile(t, filepath.Join(dir, "bad.yaml"), "kind: Deployment\napiVersion: v1\n")
	r := &fileRun{FileSource: NewFileSource(dir, "node1"), files: map[string]*fileResult{}, readAsIs: true}
	r.relistAll()
	out := make(chan Snapshot, 1)
	if !r.send(context.Background(), out, true) {
		t.Fatal("send failed")
	}
	first := <-out
	for range 3 {
		r.relistAll()
		r.send(context.Background(), out, false)
		select {
		case s := <-out:
			t.Fatalf("unchanged relist sent %s", summary(s))
		default:
		}
	}
	// Rewriting the same bytes is no change either.
	writeFile(t, filepath.Join(dir, "web.yaml"), manifest("web", "nginx"))
	r.relistAll()
	if snap, _ := r.snapshot(); snap.Pods[0] != first.Pods[0] {
		t.Error("pod rebuilt from unchanged bytes")
	}
}

func TestManifestName(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"web.yaml", true}, {"web.yml", true}, {"web.json", true}, {"WEB.YAML", true},
		{".web.yaml", false}, {"web.yaml.swp", false}, {"web.yaml~", false}, {"4913", false},
		{"web.yaml.bak", false}, {"web.yaml.orig", false}, {"web.yaml.dpkg-dist", false},
		{"web.dpkg-new.yaml", false}, {"web.yaml.tmp", false}, {"web.txt", false}, {"web", false},
	}
	for _, tt := range tests {
		if got := manifestName(tt.in); got != tt.want {
			t.Errorf("manifestName(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestReadManifestLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, path, string(bytes.Repeat([]byte("#"), MaxFileSize)))
	if _, _, ok, err := readManifest(path); !ok || err != nil {
		t.Errorf("a file of exactly MaxFileSize: ok=%v err=%v", ok, err)
	}
}

// With the default (short) debounce, an editor's save that renames the file
// away and is slow to write it anew, and a writer that truncates before it
// writes, never remove the pod.
func TestFileSourceSlowSaveNeverRemoves(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, manifest("web", "nginx:1"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	began := time.Now()
	if err := os.Rename(web, web+"~"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // a slow editor, far beyond the debounce
	writeFile(t, web, manifest("web", "nginx:2"))
	if away := time.Since(began); away >= renameSettle {
		t.Skipf("the editor was held up %s, beyond the %s a renamed file is waited for", away, renameSettle)
	}
	os.Remove(web + "~")
	expect(t, next(t, ch), "web-node1 nginx:2\n")

	// Truncated, then written much later.
	if err := os.Truncate(web, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	writeFile(t, web, manifest("web", "nginx:3"))
	expect(t, next(t, ch), "web-node1 nginx:3\n")
	barrier(t, dir, ch, "web-node1 nginx:3\n")

	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "marker-node1 busybox\n")
}

// vim with backupcopy=yes copies the file aside, then truncates and
// rewrites it in place: one update, never an empty state.
func TestFileSourceVimBackupcopyYes(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, manifest("web", "nginx:1"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	writeFile(t, web+"~", manifest("web", "nginx:1"))
	f, err := os.OpenFile(web, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // a slow save: empty for longer than the debounce
	content := manifest("web", "nginx:2")
	// One write: a writer held up between two for longer than the
	// debounce would rightly have its half-written file read.
	f.WriteString(content)
	f.Close()
	os.Remove(web + "~")
	expect(t, next(t, ch), "web-node1 nginx:2\n")
	barrier(t, dir, ch, "web-node1 nginx:2\n")
}

// sed -i writes a temporary file beside the manifest and renames it over.
func TestFileSourceSedInPlace(t *testing.T) {
	sed, err := exec.LookPath("sed")
	if err != nil {
		t.Skip("no sed")
	}
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, manifest("web", "nginx:1"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond))
	expect(t, next(t, ch), "web-node1 nginx:1\n")
	if out, err := exec.Command(sed, "-i", "s/nginx:1/nginx:2/", web).CombinedOutput(); err != nil {
		t.Fatalf("sed: %v: %s", err, out)
	}
	expect(t, next(t, ch), "web-node1 nginx:2\n")
	barrier(t, dir, ch, "web-node1 nginx:2\n")
}

// Rapid rewrites settle on the last content.
func TestFileSourceRapidRewrites(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond))
	expect(t, next(t, ch), "")
	for i := range 50 {
		writeFile(t, web, manifest("web", fmt.Sprintf("nginx:%d", i)))
	}
	for last := next(t, ch); summary(last) != "web-node1 nginx:49\n"; last = next(t, ch) {
	}
	barrier(t, dir, ch, "web-node1 nginx:49\n")
}

// A manifest deleted and written again comes back, with the same identity.
func TestFileSourceDeleteAndReAdd(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, manifest("web", "nginx:1"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond))
	first := next(t, ch)
	expect(t, first, "web-node1 nginx:1\n")
	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "")
	writeFile(t, web, manifest("web", "nginx:1"))
	again := next(t, ch)
	expect(t, again, "web-node1 nginx:1\n")
	if again.Pods[0].UID != first.Pods[0].UID {
		t.Errorf("re-added manifest got UID %s, was %s", again.Pods[0].UID, first.Pods[0].UID)
	}
}

// A ConfigMap-style directory publishes new content by swapping its ..data
// symlink; the visible file is a symlink through it and sees no event.
func TestFileSourceConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	mustSymlink := func(target, link string) {
		t.Helper()
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	mkVersion := func(name, image string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "web.yaml"), manifest("web", image))
	}
	mkVersion("..2026_01", "nginx:1")
	mustSymlink("..2026_01", filepath.Join(dir, "..data"))
	mustSymlink("..data/web.yaml", filepath.Join(dir, "web.yaml"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond)) // no relist: events only
	expect(t, next(t, ch), "web-node1 nginx:1\n")

	mkVersion("..2026_02", "nginx:2")
	mustSymlink("..2026_02", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01")); err != nil {
		t.Fatal(err)
	}
	expect(t, next(t, ch), "web-node1 nginx:2\n")
}

// envManifest is a pod whose container has the env vars named; the one with
// fewer names is a valid prefix of the one with more.
func envManifest(names ...string) string {
	m := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: nginx\n    env:\n"
	for _, n := range names {
		m += "    - {name: " + n + ", value: v}\n"
	}
	return m
}

func envNames(s Snapshot) string {
	var names []string
	for _, p := range s.Pods {
		for _, e := range p.Spec.Containers[0].Env {
			names = append(names, e.Name)
		}
	}
	return strings.Join(names, ",")
}

// A writer that pauses mid-file leaves a valid prefix (a cut env list) for
// longer than the debounce and a re-list: it must never be applied, since it
// would restart the pod with a truncated spec under a new UID.
func TestFileSourcePausedWriterNeverApplied(t *testing.T) {
	const settle, pause = 2 * time.Second, 200 * time.Millisecond
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, envManifest("X"))
	ch := startSource(t, dir, WithDebounce(10*time.Millisecond), WithRelistInterval(20*time.Millisecond),
		WithWriteSettle(settle))
	first := next(t, ch)
	if got := envNames(first); got != "X" {
		t.Fatalf("first snapshot env %q", got)
	}

	f, err := os.OpenFile(web, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	full := envManifest("A", "B")
	prefix := envManifest("A")
	began := time.Now()
	f.WriteString(prefix)
	time.Sleep(pause) // the writer pauses, far beyond the debounce and a re-list
	f.WriteString(full[len(prefix):])
	paused := time.Since(began)
	f.Close()
	if paused >= settle {
		// The machine held the writer up beyond the settle time: reading
		// the prefix is then right, and there is nothing to test.
		t.Skipf("the writer was held up %s, longer than the %s settle time", paused, settle)
	}
	for {
		s := next(t, ch)
		switch got := envNames(s); got {
		case "A,B":
			if s.Pods[0].UID == first.Pods[0].UID {
				t.Error("the new spec kept the old UID")
			}
			return
		case "A":
			t.Fatal("the valid prefix of a file being written was applied")
		}
	}
}

// A manifest being written as the source starts is read whole before the
// first snapshot: pods a first snapshot leaves out are removed.
func TestFileSourceFirstSnapshotWaitsForWriter(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	full := envManifest("A", "B")
	prefix := envManifest("A")
	const settle = 2 * time.Second
	began := time.Now()
	writeFile(t, web, prefix)
	ch := startSource(t, dir, WithWriteSettle(settle))
	time.Sleep(100 * time.Millisecond)
	f, err := os.OpenFile(web, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(full[len(prefix):])
	f.Close()
	if paused := time.Since(began); paused >= settle {
		t.Skipf("the writer was held up %s, longer than the %s settle time", paused, settle)
	}
	if got := envNames(next(t, ch)); got != "A,B" {
		t.Errorf("first snapshot env %q, want A,B", got)
	}
}

// A file renamed into place is complete: it is applied at once, however
// recently it was written, so publishing by rename costs no settle time
// and no debounce.
func TestFileSourceRenamedInIsAppliedAtOnce(t *testing.T) {
	dir := t.TempDir()
	ch := startSource(t, dir, WithWriteSettle(time.Minute), WithDebounce(time.Minute))
	next(t, ch) // the empty directory
	tmp := filepath.Join(dir, ".web.yaml.tmp")
	writeFile(t, tmp, envManifest("A"))
	began := time.Now()
	if err := os.Rename(tmp, filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := envNames(next(t, ch)); got != "A" {
		t.Fatalf("env %q, want A", got)
	}
	if took := time.Since(began); took > 30*time.Second { // the debounce is a minute
		t.Fatalf("a renamed-in file took %v to apply; it must not wait for the settle time or the debounce", took)
	}
}

// A new file still open for writing waits for the debounce after its last
// write, as any file written in a burst.
func TestFileSourceNewFileBeingWrittenWaits(t *testing.T) {
	dir := t.TempDir()
	ch := startSource(t, dir, WithDebounce(time.Second))
	next(t, ch) // the empty directory
	f, err := os.Create(filepath.Join(dir, "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Counted from the write, not from the select: a test held up between
	// them must not take the debounce's end for an early snapshot.
	wrote := time.Now()
	if _, err := f.WriteString(envManifest("A")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-ch:
		if early := time.Since(wrote); early < time.Second {
			t.Fatalf("a file still open for writing was applied %s after its write, before the 1s debounce: %q", early, envNames(s))
		}
		t.Skipf("the test was held up past the debounce")
	case <-time.After(time.Until(wrote.Add(500 * time.Millisecond))):
	}
	f.Close()
	if got := envNames(next(t, ch)); got != "A" {
		t.Fatalf("env %q, want A", got)
	}
}

func TestOpenForWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if !openForWriting(path) {
		t.Error("a file this test holds open for writing is said to have no writer")
	}
	f.Close()
	if openForWriting(path) {
		t.Error("a closed file is said to have a writer")
	}
	if !openForWriting(filepath.Join(t.TempDir(), "missing.yaml")) {
		t.Error("a file that cannot be opened is said to have no writer")
	}
}

// Files renamed in together while the consumer is busy are read and sent
// in a few snapshots once it reads again, not one per file: each
// snapshot is assembled from every file and applied to every pod.
func TestFileSourceBurstInFewSnapshots(t *testing.T) {
	const n = 40
	dir := t.TempDir()
	ch := startSource(t, dir)
	next(t, ch) // the empty directory
	publish := func(i int) {
		tmp := filepath.Join(dir, fmt.Sprintf(".p%02d.yaml", i))
		writeFile(t, tmp, manifest(fmt.Sprintf("p%02d", i), "busybox"))
		if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("p%02d.yaml", i))); err != nil {
			t.Fatal(err)
		}
	}
	publish(0)
	// The source now waits to hand over the snapshot with p00; the rest
	// is renamed in meanwhile.
	time.Sleep(100 * time.Millisecond)
	for i := 1; i < n; i++ {
		publish(i)
	}
	snaps := 0
	for {
		s := next(t, ch)
		snaps++
		if len(s.Pods) == n {
			break
		}
	}
	// fsnotify reads the queue in pieces, so not always one: a few.
	if snaps > n/4 {
		t.Fatalf("%d files renamed in at once came in %d snapshots, want at most %d", n, snaps, n/4)
	}
}

// lockedBuffer collects a logger's output from the source's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A source that cannot have an inotify watcher (the host's instances are
// used up: they are shared by every process of the user) still sends its
// first snapshot, without which the engine never starts, says why it
// polls, and sees changes by re-reading every pollInterval, well before
// the re-list (an hour here).
func TestFileSourcePollsWithoutInotify(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), manifest("a", "nginx:1"))
	logs := &lockedBuffer{}
	ch := startSource(t, dir, WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		func(s *FileSource) {
			s.newWatcher = func() (*fsnotify.Watcher, error) { return nil, syscall.EMFILE }
		})
	expect(t, next(t, ch), "a-node1 nginx:1\n")
	if got := logs.String(); !strings.Contains(got, "cannot watch manifests; re-reading them every 2s") || !strings.Contains(got, "too many open files") {
		t.Errorf("log does not say why the source polls:\n%s", got)
	}

	tmp := filepath.Join(dir, ".b.yaml.tmp")
	writeFile(t, tmp, manifest("b", "nginx:1"))
	if err := os.Rename(tmp, filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), manifest("a", "nginx:2"))
	select {
	case s := <-ch:
		// One poll may come between the two changes.
		if summary(s) == "a-node1 nginx:1\nb-node1 nginx:1\n" {
			s = <-ch
		}
		expect(t, s, "a-node1 nginx:2\nb-node1 nginx:1\n")
	case <-time.After(30 * time.Second): // the re-list is an hour away
		t.Fatal("no snapshot with the changes")
	}
}

// A re-list on the timer can read a file before the events of its write
// are taken (the event reader held up on a busy machine): a recent change
// it finds waits for the write to settle, as at start, and is not applied
// as it stands, which may be a writer's prefix. An unchanged file is read
// as before, and an old change is applied.
func TestFileSourceSweepWaitsForRecentWrite(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	writeFile(t, web, envManifest("X"))
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(web, old, old); err != nil {
		t.Fatal(err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r := &fileRun{FileSource: NewFileSource(dir, "node1", WithWriteSettle(time.Minute)), w: w, watched: dir,
		files: map[string]*fileResult{}, pending: map[string]time.Time{}, written: map[string]time.Time{}}
	r.sweep()
	if got := string(r.files[web].data); got != envManifest("X") {
		t.Fatalf("an old file not applied by a sweep: %q", got)
	}

	writeFile(t, web, envManifest("A")) // its events not taken
	r.sweep()
	if got := string(r.files[web].data); got != envManifest("X") {
		t.Fatalf("a sweep applied a write made a moment ago: %q", got)
	}
	if _, ok := r.pending[web]; !ok {
		t.Fatal("the recent write is not read again later")
	}
	if err := os.Chtimes(web, old, old); err != nil {
		t.Fatal(err)
	}
	r.sweep()
	if got := string(r.files[web].data); got != envManifest("A") {
		t.Fatalf("a settled write not applied by a sweep: %q", got)
	}
}

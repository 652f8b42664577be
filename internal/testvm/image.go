// Package testvm is make test-vm's machine: a Debian 12 image made from
// Debian's packages by .ci/vm-image and cached by its recipe, booted by
// qemu (KVM when the host has it, TCG otherwise) with only ssh forwarded,
// to a loopback port, and driven over ssh. Power cuts kill qemu, so the
// guest's unflushed writes are lost as they would be.
package testvm

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testnode"
)

// Runtime is the containerd and runc pair (testnode.Runtimes) the image
// runs instead of Debian's 1.6.20 and 1.1.5.
const Runtime = "2.x"

// Image is a built image: disk.raw, vmlinuz, initrd.img and the kernel
// command line (cmdline) in Dir, and the keys ssh uses to reach its
// machines.
type Image struct {
	Dir     string
	signer  ssh.Signer
	hostKey ssh.PublicKey
	// Built is how long the build took; 0 when the image was cached.
	Built time.Duration
}

// Build returns the image of the recipe .ci/vm-image under repo, building
// it unless ~/.cache/noderun-test/vm holds one of the same recipe: the
// script, the Debian mirror, the runtime pair and the ssh key. A lock
// keeps parallel test processes from building it twice.
func Build(ctx context.Context, repo string) (*Image, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	cache = filepath.Join(cache, "noderun-test", "vm")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	signer, pub, err := clientKey(filepath.Join(cache, "id_ed25519"))
	if err != nil {
		return nil, err
	}
	script := filepath.Join(repo, ".ci", "vm-image")
	recipe, err := os.ReadFile(script)
	if err != nil {
		return nil, err
	}
	mirror, err := HostMirror("/etc/apt")
	if err != nil {
		return nil, err
	}
	rtdir, err := testnode.BuiltRuntime(ctx, Runtime)
	if err != nil {
		return nil, err
	}
	sum := sha256.New()
	for _, part := range [][]byte{recipe, []byte(mirror), []byte(filepath.Base(rtdir)), pub} {
		fmt.Fprintf(sum, "%d:%s", len(part), part)
	}
	dir := filepath.Join(cache, hex.EncodeToString(sum.Sum(nil))[:16])
	img := &Image{Dir: dir, signer: signer}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "disk.raw")); errors.Is(err, os.ErrNotExist) {
		start := time.Now()
		if err := build(ctx, script, cache, dir, mirror, rtdir, pub); err != nil {
			return nil, err
		}
		img.Built = time.Since(start)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ssh_host_ed25519_key.pub"))
	if err == nil {
		img.hostKey, _, _, _, err = ssh.ParseAuthorizedKey(b)
	}
	return img, err
}

// build runs the recipe into a directory of its own, renamed to dir once
// complete, so that an interrupted build is never taken for an image.
func build(ctx context.Context, script, cache, dir, mirror, rtdir string, pub []byte) error {
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	key := filepath.Join(tmp, "authorized_keys")
	if err := os.WriteFile(key, pub, 0o600); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, script, filepath.Join(tmp, "image"), mirror, rtdir, key).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", script, err, out)
	}
	return os.Rename(filepath.Join(tmp, "image"), dir)
}

// clientKey loads the ssh key the tests log in with, made once.
func clientKey(path string) (ssh.Signer, []byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, nil, gerr
		}
		block, merr := ssh.MarshalPrivateKey(priv, "noderun make test-vm")
		if merr != nil {
			return nil, nil, merr
		}
		b = pem.EncodeToMemory(block)
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return signer, ssh.MarshalAuthorizedKey(signer.PublicKey()), nil
}

// HostMirror is the Debian mirror this host's apt uses (under dir,
// /etc/apt): the first URI of a sources.list line or a deb822 .sources
// file that is not the security archive.
func HostMirror(dir string) (string, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", "*"))
	for _, f := range append([]string{filepath.Join(dir, "sources.list")}, files...) {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			var uri string
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				uri = fields[1]
			case len(fields) >= 3 && fields[0] == "deb":
				uri = debURI(fields[1:])
			}
			if uri != "" && !strings.Contains(uri, "security") {
				file.Close()
				return uri, nil
			}
		}
		file.Close()
	}
	return "", fmt.Errorf("no Debian mirror in %s/sources.list or sources.list.d", dir)
}

// debURI is the URI of a one-line source's fields after "deb": the first
// past any [options].
func debURI(fields []string) string {
	inOptions := false
	for _, f := range fields {
		switch {
		case strings.HasPrefix(f, "["):
			inOptions = !strings.HasSuffix(f, "]")
		case inOptions:
			inOptions = !strings.HasSuffix(f, "]")
		default:
			return f
		}
	}
	return ""
}

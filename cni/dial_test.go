package cni

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// DialLoopback reaches a server listening on the pod's loopback, which the
// host's loopback does not reach.
func TestDialLoopback(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "pod")
	nss, err := CreateNamespaces(dir, "", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveNamespaces(dir, nil) })
	ln := inNamespace(t, nss.Net, unix.CLONE_NEWNET, func() (net.Listener, error) {
		return net.Listen("tcp", "127.0.0.1:0")
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "from the pod")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	conn, err := DialLoopback(context.Background(), nss.Net, port)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || string(got) != "from the pod" {
		t.Errorf("read %q, %v; want %q", got, err, "from the pod")
	}
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
		// Something on the host may hold the port by chance; it is not
		// the pod's server.
		b, _ := io.ReadAll(c)
		c.Close()
		if string(b) == "from the pod" {
			t.Error("the host's loopback reached the pod's server")
		}
	}
	if _, err := DialLoopback(context.Background(), filepath.Join(dir, "missing"), port); err == nil {
		t.Error("dial through a missing namespace succeeded")
	}
}

package kubeapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/noderun/noderun/internal/execio"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// ExitError is a remote command's non-zero exit code.
type ExitError struct{ Code int }

func (e *ExitError) Error() string {
	return "command terminated with exit code " + strconv.Itoa(e.Code)
}

// RemoteCommand runs the exec or attach at url (its query says which
// streams, as kubectl sends it) over SPDY v4, as client-go does for
// kubectl, with the streams of s. A non-zero exit code is an *ExitError.
// It is `noderun exec`'s client, so that nodes without kubectl need not
// link client-go.
func RemoteCommand(ctx context.Context, url string, tlsConfig *tls.Config, token string, s execio.ExecIO) error {
	conn, err := dialSPDY(ctx, url, tlsConfig, token, remoteCommandV4)
	if err != nil {
		return err
	}
	defer conn.Close()
	create := func(typ string) (httpstream.Stream, error) {
		h := http.Header{}
		h.Set(streamTypeHeader, typ)
		st, err := conn.CreateStream(h)
		if err != nil {
			return nil, fmt.Errorf("create %s stream: %w", typ, err)
		}
		return st, nil
	}
	errStream, err := create(streamTypeError)
	if err != nil {
		return err
	}
	errStream.Close() // read only
	var wg sync.WaitGroup
	if s.Stdin != nil {
		st, err := create(streamTypeStdin)
		if err != nil {
			return err
		}
		go func() {
			io.Copy(st, s.Stdin)
			st.Close() // the command sees the end of its input
		}()
	}
	for _, o := range []struct {
		typ string
		w   io.Writer
	}{{streamTypeStdout, s.Stdout}, {streamTypeStderr, s.Stderr}} {
		if o.w == nil || (s.TTY && o.typ == streamTypeStderr) {
			continue
		}
		st, err := create(o.typ)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(o.w, st)
		}()
	}
	if s.TTY && s.Resize != nil {
		st, err := create(streamTypeResize)
		if err != nil {
			return err
		}
		go func() {
			enc := json.NewEncoder(st)
			for sz := range s.Resize {
				if enc.Encode(sz) != nil {
					return
				}
			}
		}()
	}
	status, err := io.ReadAll(errStream)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("read the command's status: %w", err)
	}
	return statusResult(status)
}

// statusResult reads the v4 Status that ends a remote command.
func statusResult(b []byte) error {
	var st metav1.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("the command's status %q: %w", b, err)
	}
	if st.Status == metav1.StatusSuccess {
		return nil
	}
	if st.Reason == "NonZeroExitCode" && st.Details != nil {
		for _, c := range st.Details.Causes {
			if c.Type == "ExitCode" {
				if code, err := strconv.Atoi(c.Message); err == nil {
					return &ExitError{Code: code}
				}
			}
		}
	}
	return errors.New(st.Message)
}

// dialSPDY upgrades a request to url to SPDY with protocol.
func dialSPDY(ctx context.Context, url string, tlsConfig *tls.Config, token, protocol string) (httpstream.Connection, error) {
	rt, err := spdy.NewRoundTripper(tlsConfig)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(httpstream.HeaderProtocolVersion, protocol)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	conn, err := rt.NewConnection(resp)
	if err != nil {
		return nil, err
	}
	if got := resp.Header.Get(httpstream.HeaderProtocolVersion); got != protocol {
		conn.Close()
		return nil, fmt.Errorf("the server speaks %q, not %q", got, protocol)
	}
	return conn, nil
}

package mirror

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// apiError is an API server's answer other than success, with the
// Status it sent when it sent one.
type apiError struct {
	method, path string
	code         int
	status       metav1.Status
}

func (e *apiError) Error() string {
	msg := e.status.Message
	if msg == "" {
		msg = http.StatusText(e.code)
	}
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.code, msg)
}

// statusCode is err's HTTP status, or 0 when the server did not answer.
func statusCode(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	return 0
}

// Content types of the writes: a JSON merge patch replaces each list it
// names whole, which is what a status written from noderun's own wants.
const (
	contentJSON  = "application/json"
	contentMerge = "application/merge-patch+json"
)

// call sends one request with in (when not nil) as JSON and decodes the
// answer into out (when not nil).
func (c *connection) call(ctx context.Context, method, path, contentType string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", contentJSON)
	req.Header.Set("User-Agent", "noderun")
	if in != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &apiError{method: method, path: path, code: resp.StatusCode}
		_ = json.Unmarshal(b, &ae.status)
		return ae
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

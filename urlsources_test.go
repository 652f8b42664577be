package main

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/manifests"
)

func TestNewURLSources(t *testing.T) {
	tests := []struct {
		args    []string
		want    int
		wantErr bool
	}{
		{args: []string{"--manifest-url", "http://127.0.0.1:1/p", "--manifest-url", "https://h/q", "--manifest-url", "http://127.0.0.1:1/p"}, want: 2},
		{args: []string{"--manifest-url", "/etc/pods"}, wantErr: true},
		{args: []string{"--manifest-url", "http://h/p", "--manifest-url-header", "no colon"}, wantErr: true},
		{args: []string{"--manifest-url", "http://a:1@h/p", "--manifest-url", "http://b:2@h/p"}, wantErr: true},
		{args: []string{"--manifest-url", "http://h/p?t=1", "--manifest-url", "http://h/p?t=1#x"}, wantErr: true},
		{args: []string{"--manifest-url", "http://h/p?t=1", "--manifest-url", "http://h/p?t=2"}, want: 2},
		{args: nil, want: 0},
	}
	for _, tt := range tests {
		var got []*manifests.URLSource
		app := &cli.App{Flags: flags(), Action: func(c *cli.Context) (err error) {
			got, err = newURLSources(c, "n1", t.TempDir(), nil)
			return err
		}}
		err := app.Run(append([]string{"noderun"}, tt.args...))
		if (err != nil) != tt.wantErr || len(got) != tt.want {
			t.Errorf("%q: %d sources, err %v", tt.args, len(got), err)
		}
	}
}

// The engine starts once it has one snapshot per source name (runner
// Engine.Run): URLs that show alike once query values are hidden must still
// give distinct names, or noderun waits forever, and must keep distinct state.
func TestNewURLSourcesDistinctNames(t *testing.T) {
	srv := httptest.NewServer(http.FileServer(http.Dir("manifests/testdata")))
	defer srv.Close()
	stateDir := t.TempDir()
	var sources []*manifests.URLSource
	app := &cli.App{Flags: flags(), Action: func(c *cli.Context) (err error) {
		sources, err = newURLSources(c, "n1", stateDir, nil)
		return err
	}}
	args := []string{"noderun", "--manifest-url", srv.URL + "/list.json?token=a", "--manifest-url", srv.URL + "/list.json?token=b",
		"--manifest-url", srv.URL + "/web.yaml"}
	if err := app.Run(args); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan manifests.Snapshot)
	for _, s := range sources {
		go func() { _ = s.Run(ctx, snaps) }()
	}
	names := map[string]bool{}
	for range sources {
		select {
		case snap := <-snaps:
			names[snap.Source] = true
			if strings.Contains(snap.Source, "token=a") || strings.Contains(snap.Source, "token=b") {
				t.Errorf("source name %q shows a query value", snap.Source)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a source sent nothing")
		}
	}
	want := map[string]bool{"http:" + srv.URL + "/list.json?token=xxxxx": true, "http:" + srv.URL + "/list.json?token=xxxxx#2": true,
		"http:" + srv.URL + "/web.yaml": true}
	if !maps.Equal(names, want) {
		t.Errorf("source names %v, want %v", names, want)
	}
	if files, _ := filepath.Glob(filepath.Join(stateDir, "*.json")); len(files) != 3 {
		t.Errorf("state files %v, want one per URL", files)
	}
}

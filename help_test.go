package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestHelpWithoutTemplates: urfave/cli's help, which noderun's copy writes
// without text/template (third_party/urfave-cli-v2/README.md), is byte for
// byte what upstream's template printer writes: for every way to ask
// noderun for help, every command's, and apps that use every part of the
// templates noderun does not.
func TestHelpWithoutTemplates(t *testing.T) {
	pages := 0
	prev := cli.HelpPrinter
	t.Cleanup(func() { cli.HelpPrinter = prev })
	cli.HelpPrinter = func(w io.Writer, templ string, data interface{}) {
		pages++
		_, _ = w.Write(sameHelp(t, templ, data, nil))
	}
	run := func(app *cli.App, args ...string) {
		t.Helper()
		app.Writer, app.ErrWriter = io.Discard, io.Discard
		if err := app.RunContext(context.Background(), append([]string{app.Name}, args...)); err != nil {
			t.Errorf("%s %q: %v", app.Name, args, err)
		}
	}
	run(newApp(), "--help")
	run(newApp(), "help")
	for _, c := range newApp().Commands {
		run(newApp(), c.Name, "--help")
		run(newApp(), "help", c.Name)
		for _, sub := range c.Subcommands {
			run(newApp(), c.Name, sub.Name, "--help")
			run(newApp(), c.Name, "help", sub.Name)
		}
	}
	for _, args := range [][]string{{"--help"}, {"one", "--help"}, {"two", "--help"}, {"two", "sub", "--help"}, {"help", "two"}} {
		run(richApp(), args...)
	}
	if want := 2 + 2*len(newApp().Commands) + 5; pages < want {
		t.Errorf("%d help pages compared, want at least %d", pages, want)
	}

	// Custom functions: wrapAt and an ExtraInfo's, with every template.
	app := richApp()
	app.Writer = io.Discard
	if err := app.RunContext(context.Background(), []string{app.Name, "one", "--help"}); err != nil {
		t.Fatal(err)
	}
	funcs := map[string]interface{}{"wrapAt": func() int { return 30 }, "ExtraInfo": func() map[string]string { return nil }}
	sameHelp(t, cli.AppHelpTemplate, app, funcs)
	for _, c := range app.Commands {
		sameHelp(t, cli.CommandHelpTemplate, c, funcs)
		sameHelp(t, cli.SubcommandHelpTemplate, c, funcs)
	}
}

// sameHelp returns the help page the default printer writes, after
// checking it against upstream's template printer's.
func sameHelp(t *testing.T, templ string, data interface{}, funcs map[string]interface{}) []byte {
	t.Helper()
	var got, want bytes.Buffer
	cli.HelpPrinterCustom(&got, templ, data, funcs)
	cli.PrintHelpTemplate(&want, templ, data, funcs)
	if got.String() != want.String() {
		t.Errorf("help differs from the template's for %T:\n%s\nwant:\n%s", data, got.String(), want.String())
	}
	if got.Len() == 0 {
		t.Errorf("no help written for %T", data)
	}
	return got.Bytes()
}

// richApp uses what noderun's help does not: authors, copyright, usage
// text, command and flag categories, hidden parts, arguments, long lines.
func richApp() *cli.App {
	long := strings.Repeat("a long usage line that the help wraps ", 8)
	return &cli.App{
		Name: "rich", Usage: long, Version: "1.2.3", Description: "first line\nsecond line, " + long,
		Authors:   []*cli.Author{{Name: "A", Email: "a@example.com"}, {Name: "B"}},
		Copyright: "(c) someone\n" + long, ArgsUsage: "FILE...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "plain", Usage: long},
			&cli.BoolFlag{Name: "hidden", Hidden: true},
		},
		Commands: []*cli.Command{
			{Name: "one", Aliases: []string{"1", "uno"}, Usage: long, UsageText: "rich one [options]\n  and more", Args: true,
				Category: "numbers", Description: long,
				Flags: []cli.Flag{
					&cli.IntFlag{Name: "n", Category: "counts", Usage: "how many", Value: 3},
					&cli.DurationFlag{Name: "d", Category: "times", Usage: long},
					&cli.StringSliceFlag{Name: "s", Usage: "uncategorised"},
				},
				Action: func(*cli.Context) error { return nil }},
			{Name: "two", Usage: "has subcommands", Category: "numbers", Args: true,
				Subcommands: []*cli.Command{
					{Name: "sub", Usage: "a subcommand", Flags: []cli.Flag{&cli.BoolFlag{Name: "x", Usage: "x"}}, Action: func(*cli.Context) error { return nil }},
					{Name: "other", Aliases: []string{"o"}, Category: "cat", Usage: long, Action: func(*cli.Context) error { return nil }},
					{Name: "secret", Hidden: true, Action: func(*cli.Context) error { return nil }},
				}},
			{Name: "three", Usage: long, Action: func(*cli.Context) error { return nil }},
			{Name: "ghost", Hidden: true, Action: func(*cli.Context) error { return nil }},
		},
	}
}

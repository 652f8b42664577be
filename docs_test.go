package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

//go:generate go test -count=1 -run ^TestFlagsReference$ . -update-docs

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/reference/flags.md")

// The flag reference is generated from the command line itself, so it
// cannot drift: `make docs` (or go generate) rewrites it.
func TestFlagsReference(t *testing.T) {
	const path = "docs/reference/flags.md"
	want := flagsReference(newApp())
	got, err := os.ReadFile(path)
	if err == nil && string(got) == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is out of date (%v): run make docs", path, err)
}

// Every command says in its help which document tells more.
func TestCommandsPointToDocs(t *testing.T) {
	var check func(prefix string, cmds []*cli.Command)
	check = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden {
				continue
			}
			name := prefix + " " + c.Name
			if c.Usage == "" || strings.Contains(c.Usage, "\n") {
				t.Errorf("%s: want a one-line Usage, have %q", name, c.Usage)
			}
			if !strings.Contains(c.Description, ".md") {
				t.Errorf("%s: its Description names no document: %q", name, c.Description)
			}
			for _, doc := range strings.Fields(c.Description) {
				doc = strings.TrimRight(doc, ".,;")
				if strings.HasSuffix(doc, ".md") {
					if _, err := os.Stat(doc); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}
			}
			check(name, c.Subcommands)
		}
	}
	check("noderun", newApp().Commands)
}

// Every relative link in the user's docs leads to a file that exists and,
// with a #fragment, to one of its headings (GitHub's anchors).
func TestDocsLinks(t *testing.T) {
	files, _ := filepath.Glob("docs/*.md")
	more, _ := filepath.Glob("docs/reference/*.md")
	files = append(append(files, more...), "README.md")
	heading := regexp.MustCompile("(?m)^#+ (.*)$")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	notAnchor := regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	anchors := map[string]map[string]bool{}
	text := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text[f] = string(b)
		anchors[f] = map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
			a := notAnchor.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), "")
			anchors[f][strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	for _, f := range files {
		for _, m := range link.FindAllStringSubmatch(text[f], -1) {
			target, frag, _ := strings.Cut(m[1], "#")
			if strings.Contains(target, "://") {
				continue
			}
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %s: %v", f, m[1], err)
					continue
				}
			}
			if frag != "" && anchors[path] != nil && !anchors[path][frag] {
				t.Errorf("%s: link %s: %s has no such heading", f, m[1], path)
			}
		}
	}
}

func flagsReference(app *cli.App) string {
	var b strings.Builder
	b.WriteString(`# Command-line reference

<!-- Generated from the command line's definitions by ` + "`make docs`" + `; do not edit. -->

` + "`noderun [flags]`" + ` runs the node; ` + "`noderun [flags] COMMAND [command flags] ARGS...`" + ` runs one
of the commands below. The commands take the node's flags too, before the command's name, to find
its directories and sockets (` + "`noderun --state-dir /srv/noderun reset`" + `).

Every flag of the node can also be set through an environment variable: ` + "`--state-dir`" + ` is
` + "`NODERUN_STATE_DIR`" + `. For repeatable flags, the variable's value is split on commas.

`)
	fmt.Fprintf(&b, "## noderun\n\n%s.\n\n%s\n\n", capitalize(app.Usage), markdownText(oneParagraph(app.Description)))
	flagTable(&b, app.Flags, true)
	var cmds func(prefix string, list []*cli.Command)
	cmds = func(prefix string, list []*cli.Command) {
		for _, c := range list {
			if c.Hidden {
				continue
			}
			name := prefix + " " + c.Name
			fmt.Fprintf(&b, "\n## %s\n\n", name)
			usage := name
			if len(c.Flags) > 0 {
				usage += " [flags]"
			}
			if c.ArgsUsage != "" {
				usage += " " + c.ArgsUsage
			}
			if len(c.Subcommands) > 0 {
				usage += " COMMAND"
			}
			fmt.Fprintf(&b, "`%s`: %s.\n", usage, markdownText(c.Usage))
			if c.Description != "" {
				fmt.Fprintf(&b, "\n%s\n", markdownText(oneParagraph(c.Description)))
			}
			if len(c.Flags) > 0 {
				b.WriteString("\n")
				flagTable(&b, c.Flags, false)
			}
			cmds(name, c.Subcommands)
		}
	}
	cmds("noderun", app.Commands)
	return b.String()
}

func flagTable(b *strings.Builder, flags []cli.Flag, withEnv bool) {
	if withEnv {
		b.WriteString("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n")
	} else {
		b.WriteString("| flag | default | meaning |\n| --- | --- | --- |\n")
	}
	for _, f := range flags {
		d, ok := f.(cli.DocGenerationFlag)
		if !ok {
			panic(fmt.Sprintf("flag %v cannot be documented", f.Names()))
		}
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		var names []string
		for _, n := range f.Names() {
			if len(n) == 1 {
				names = append(names, "`-"+n+"`")
			} else {
				names = append(names, "`--"+n+"`")
			}
		}
		def := d.GetDefaultText()
		if !d.TakesValue() || def == `""` {
			def = ""
		}
		if def = strings.Trim(def, `"`); def != "" && !strings.Contains(def, " ") {
			def = "`" + def + "`"
		}
		usage := d.GetUsage()
		if s, ok := f.(cli.DocGenerationSliceFlag); ok && s.IsSliceFlag() && !strings.Contains(usage, "repeatable") {
			usage += " (repeatable)"
		}
		usage = markdownText(usage)
		if withEnv {
			var env []string
			for _, e := range d.GetEnvVars() {
				env = append(env, "`"+e+"`")
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", strings.Join(names, ", "), strings.Join(env, ", "), def, usage)
		} else {
			fmt.Fprintf(b, "| %s | %s | %s |\n", strings.Join(names, ", "), def, usage)
		}
	}
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// oneParagraph joins a Description's lines, which help prints as they are.
func oneParagraph(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// markdownText makes help text safe in Markdown: words with placeholders
// (<state-dir>), globs and flag names become code, table bars are escaped.
func markdownText(s string) string {
	words := strings.Split(s, " ")
	for i, w := range words {
		if strings.Contains(w, "`") {
			continue
		}
		core := strings.TrimLeft(w, "(")
		pre := w[:len(w)-len(core)]
		core = strings.TrimRight(core, "),;:.")
		post := w[len(pre)+len(core):]
		switch {
		case strings.HasSuffix(core, ".md"):
			// A document named in help: a link, from docs/reference.
			target := "../../" + core
			if rest, ok := strings.CutPrefix(core, "docs/"); ok {
				target = "../" + rest
			}
			words[i] = pre + "[" + core + "](" + target + ")" + post
		case strings.ContainsAny(core, "<*") || strings.HasPrefix(core, "--"):
			words[i] = pre + "`" + core + "`" + post
		}
	}
	return strings.ReplaceAll(strings.Join(words, " "), "|", `\|`)
}

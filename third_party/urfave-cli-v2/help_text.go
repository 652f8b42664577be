package cli

// noderun's change to urfave/cli v2.27.7 (see README.md beside it): the
// default help printer writes the default templates' text with Go code
// instead of executing them with text/template. Template execution calls
// methods by name, so wherever it is reachable the linker keeps every
// exported method of every type in the program.

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// The templates as this package defines them, kept to recognise them: a
// program may have changed the exported variables.
var (
	defaultAppHelpTemplate        = AppHelpTemplate
	defaultCommandHelpTemplate    = CommandHelpTemplate
	defaultSubcommandHelpTemplate = SubcommandHelpTemplate
)

// printHelpCustom is the default HelpPrinterCustom. It writes what
// PrintHelpTemplate writes for the three default templates, with the
// "wrap" and "wrapAt" custom functions honoured; other custom functions
// are unused by those templates. Any other template is not rendered: it
// says so on ErrWriter (set HelpPrinterCustom to PrintHelpTemplate).
func printHelpCustom(out io.Writer, templ string, data interface{}, customFuncs map[string]interface{}) {
	const maxLineLength = 10000
	h := &helpText{wrap: func(input string, offset int) string { return wrap(input, offset, maxLineLength) }}
	if f, ok := customFuncs["wrap"].(func(string, int) string); ok {
		h.wrap = f
	}
	if f, ok := customFuncs["wrapAt"].(func() int); ok {
		wrapAt := f()
		h.wrap = func(input string, offset int) string { return wrap(input, offset, wrapAt) }
	}
	app, isApp := data.(*App)
	cmd, isCommand := data.(*Command)
	var write func()
	switch {
	case isApp && app != nil && templ == defaultAppHelpTemplate:
		write = func() { h.app(app) }
	case isCommand && cmd != nil && templ == defaultCommandHelpTemplate:
		write = func() { h.command(cmd, false) }
	case isCommand && cmd != nil && templ == defaultSubcommandHelpTemplate:
		write = func() { h.command(cmd, true) }
	default:
		_, _ = fmt.Fprintf(ErrWriter, "cli: help for %T not written: only the default templates are rendered without cli.PrintHelpTemplate\n", data)
		return
	}
	w := tabwriter.NewWriter(out, 1, 8, 2, ' ', 0)
	err := h.write(write)
	_, _ = io.WriteString(w, h.String())
	if err != nil {
		// As the template's execution ends at a method that panics (a
		// Command's VisibleCategories before the command ran): with the
		// text so far that the tabwriter let through, unflushed.
		if os.Getenv("CLI_TEMPLATE_ERROR_DEBUG") != "" {
			_, _ = fmt.Fprintf(ErrWriter, "CLI TEMPLATE ERROR: %#v\n", err)
		}
		return
	}
	_ = w.Flush()
}

// write runs f, returning what it panicked with as an error, as template
// execution turns a panic in a method it calls into its error.
func (h *helpText) write(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("help: %v", r)
		}
	}()
	f()
	return nil
}

// helpText builds the text of one help page; each method writes what the
// template of the same name writes.
type helpText struct {
	strings.Builder
	wrap func(input string, offset int) string
}

// app is AppHelpTemplate.
func (h *helpText) app(a *App) {
	h.WriteString("NAME:\n   ")
	h.helpName(a.HelpName, a.Usage)
	h.WriteString("\n\nUSAGE:\n   ")
	if a.UsageText != "" {
		h.WriteString(h.wrap(a.UsageText, 3))
	} else {
		h.WriteString(a.HelpName + " ")
		if len(a.VisibleFlags()) > 0 {
			h.WriteString("[global options]")
		}
		if len(a.Commands) > 0 {
			h.WriteString(" command [command options]")
		}
		h.argsUsage(a.ArgsUsage, a.Args)
	}
	if a.Version != "" && !a.HideVersion {
		h.WriteString("\n\nVERSION:\n   " + a.Version)
	}
	h.description(a.Description)
	if len(a.Authors) > 0 {
		h.authors(a.Authors)
	}
	if len(a.VisibleCommands()) > 0 {
		h.WriteString("\n\nCOMMANDS:")
		h.commandCategories(a.VisibleCategories())
	}
	h.flags("GLOBAL OPTIONS:", a.VisibleFlagCategories, a.VisibleFlags)
	if a.Copyright != "" {
		h.WriteString("\n\nCOPYRIGHT:\n   " + h.wrap(a.Copyright, 3))
	}
	h.WriteString("\n")
}

// command is CommandHelpTemplate, or SubcommandHelpTemplate when
// subcommands is set.
func (h *helpText) command(c *Command, subcommands bool) {
	h.WriteString("NAME:\n   ")
	h.helpName(c.HelpName, c.Usage)
	h.WriteString("\n\nUSAGE:\n   ")
	if c.UsageText != "" {
		h.WriteString(h.wrap(c.UsageText, 3))
	} else {
		h.WriteString(c.HelpName)
		if len(c.VisibleFlags()) > 0 {
			h.WriteString(" [command options]")
		}
		h.argsUsage(c.ArgsUsage, c.Args)
	}
	if c.Category != "" {
		h.WriteString("\n\nCATEGORY:\n   " + c.Category)
	}
	h.description(c.Description)
	if subcommands && len(c.VisibleCommands()) > 0 {
		h.WriteString("\n\nCOMMANDS:")
		h.commandCategories(c.VisibleCategories())
	}
	h.flags("OPTIONS:", c.VisibleFlagCategories, c.VisibleFlags)
	h.WriteString("\n")
}

// helpName is helpNameTemplate.
func (h *helpText) helpName(name, usage string) {
	h.WriteString(h.wrap(name, 3))
	if usage != "" {
		h.WriteString(" - " + h.wrap(usage, len(name)+6))
	}
}

// argsUsage is the end of usageTemplate, after the flags.
func (h *helpText) argsUsage(argsUsage string, args bool) {
	if argsUsage != "" {
		h.WriteString(" " + argsUsage)
	} else if args {
		h.WriteString(" [arguments...]")
	}
}

// description is the DESCRIPTION section with descriptionTemplate.
func (h *helpText) description(d string) {
	if d != "" {
		h.WriteString("\n\nDESCRIPTION:\n   " + h.wrap(d, 3))
	}
}

// authors is the AUTHOR section with authorsTemplate.
func (h *helpText) authors(authors []*Author) {
	h.WriteString("\n\nAUTHOR")
	if len(authors) != 1 {
		h.WriteString("S")
	}
	h.WriteString(":\n   ")
	for i, a := range authors {
		if i > 0 {
			h.WriteString("\n   ")
		}
		_, _ = fmt.Fprint(h, a)
	}
}

// commandCategories is visibleCommandCategoryTemplate.
func (h *helpText) commandCategories(categories []CommandCategory) {
	for _, cat := range categories {
		if cat.Name() == "" {
			h.commands(cat.VisibleCommands())
			continue
		}
		h.WriteString("\n   " + cat.Name() + ":")
		for _, c := range cat.VisibleCommands() {
			h.WriteString("\n     " + strings.Join(c.Names(), ", ") + "\t" + c.Usage)
		}
	}
}

// commands is visibleCommandTemplate: names in a column as wide as the
// widest, usages wrapped beside it.
func (h *helpText) commands(cmds []*Command) {
	col := offsetCommands(cmds, 5)
	for _, c := range cmds {
		names := strings.Join(c.Names(), ", ")
		h.WriteString("\n   " + names + indent(col-offset(names, 3), "") + h.wrap(c.Usage, col))
	}
}

// flags is the flags' section, titled title: visibleFlagCategoryTemplate
// if there are flag categories, else visibleFlagTemplate.
func (h *helpText) flags(title string, categories func() []VisibleFlagCategory, visible func() []Flag) {
	if cats := categories(); len(cats) > 0 {
		h.WriteString("\n\n" + title)
		for _, cat := range cats {
			h.WriteString("\n   ")
			if cat.Name() != "" {
				h.WriteString(cat.Name() + "\n\n   ")
			}
			flags := cat.Flags()
			for i, f := range flags {
				_, _ = fmt.Fprint(h, f)
				if i == len(flags)-1 {
					h.WriteString("\n")
				} else {
					h.WriteString("\n   ")
				}
			}
		}
		return
	}
	if flags := visible(); len(flags) > 0 {
		h.WriteString("\n\n" + title)
		for _, f := range flags {
			h.WriteString("\n   " + h.wrap(f.String(), 6))
		}
	}
}

// Package nodelog is the kubelet's Node Log Query (GET /logs/, GA in
// v1.36): a unit's journal through journalctl on a systemd host, a file
// under the log directory (/var/log) otherwise, with the kubelet's query
// parameters, their validation and its error texts. It runs with noderun's
// privileges: the API serves it to the admin token only.
package nodelog

import (
	"fmt"
	"net/url"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The kubelet's limits (pkg/kubelet/kubelet_server_journal.go).
const (
	maxTailLines     = 100000
	maxServiceLength = 256
	maxServices      = 4
	// journalDate is the layout the kubelet hands journalctl's --since
	// and --until. Times are given in UTC, as --utc reads them (the
	// kubelet keeps the offset the client sent, an hour off in CET).
	journalDate = "2006-1-2 15:4:5"
)

// unsafeService matches what a unit name may not hold: only these
// characters ever reach journalctl's arguments.
var unsafeService = regexp.MustCompile(`[^a-zA-Z\-_.:0-9@]+`)

// Options are the query's parameters besides the names.
type Options struct {
	SinceTime *time.Time
	UntilTime *time.Time
	TailLines *int
	Boot      *int
	Pattern   string
}

// Query is a parsed node log query: services (journal units, or log
// files by the kubelet's heuristics) or one file under the log directory.
type Query struct {
	Services []string
	Files    []string
	Options
}

// Parse reads a query as the kubelet's newNodeLogQuery: nil and no errors
// when it holds none of the parameters (then the path names what to serve).
// Its errors are a 400.
func Parse(q url.Values) (*Query, field.ErrorList) {
	var errs field.ErrorList
	var n Query
	queries, ok := q["query"]
	for _, s := range queries {
		// A / or \ marks a file; foo.log without one is a service, which the
		// heuristics still find as a file.
		if strings.ContainsAny(s, `/\`) {
			n.Files = append(n.Files, s)
		} else if strings.TrimSpace(s) != "" {
			n.Services = append(n.Services, s)
		}
	}
	if ok && len(n.Files) == 0 && len(n.Services) == 0 {
		errs = append(errs, field.Invalid(field.NewPath("query"), queries, "query cannot be empty"))
	}
	n.SinceTime = parseTime(q, "sinceTime", &errs)
	n.UntilTime = parseTime(q, "untilTime", &errs)
	n.Boot = parseInt(q, "boot", &errs)
	n.TailLines = parseInt(q, "tailLines", &errs)
	n.Pattern = q.Get("pattern")
	if len(errs) > 0 {
		return nil, errs
	}
	if len(n.Files) == 0 && len(n.Services) == 0 && n.Options == (Options{}) {
		return nil, nil
	}
	return &n, nil
}

func parseTime(q url.Values, name string, errs *field.ErrorList) *time.Time {
	v := q.Get(name)
	if v == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		*errs = append(*errs, field.Invalid(field.NewPath(name), v, "invalid time format"))
		return nil
	}
	return &t
}

func parseInt(q url.Values, name string, errs *field.ErrorList) *int {
	v := q.Get(name)
	if v == "" {
		return nil
	}
	i, err := strconv.Atoi(v)
	if err != nil {
		*errs = append(*errs, field.Invalid(field.NewPath(name), v, err.Error()))
		return nil
	}
	return &i
}

// Validate checks a parsed query as the kubelet's validate does; stat
// answers whether its one file exists under the log directory. Its errors
// are a 406.
func (n *Query) Validate(stat func(name string) error) field.ErrorList {
	var errs field.ErrorList
	for _, s := range n.Services {
		if err := safeServiceName(s); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("query"), s, err.Error()))
		}
	}
	if len(n.Services) > maxServices {
		errs = append(errs, field.TooMany(field.NewPath("query"), len(n.Services), maxServices))
	}
	switch {
	case len(n.Files) == 0 && len(n.Services) == 0:
		errs = append(errs, field.Required(field.NewPath("query"), "cannot be empty with options"))
	case len(n.Files) > 0 && len(n.Services) > 0:
		errs = append(errs, field.Invalid(field.NewPath("query"), fmt.Sprintf("%v, %v", n.Files, n.Services),
			"cannot specify a file and service"))
	case len(n.Files) > 1:
		errs = append(errs, field.Invalid(field.NewPath("query"), n.Files, "cannot specify more than one file"))
	case len(n.Files) == 1 && n.Options != (Options{}):
		errs = append(errs, field.Invalid(field.NewPath("query"), n.Files, "cannot specify file with options"))
	case len(n.Files) == 1:
		if err := stat(n.Files[0]); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("query"), n.Files, err.Error()))
		}
	}
	if n.SinceTime != nil && n.UntilTime != nil && n.SinceTime.After(*n.UntilTime) {
		errs = append(errs, field.Invalid(field.NewPath("untilTime"), n.UntilTime, "must be after `sinceTime`"))
	}
	if n.Boot != nil && *n.Boot > 0 {
		errs = append(errs, field.Invalid(field.NewPath("boot"), *n.Boot, "must be less than 1"))
	}
	if n.TailLines != nil {
		if msgs := validation.IsInRange(*n.TailLines, 0, maxTailLines); len(msgs) > 0 {
			errs = append(errs, field.Invalid(field.NewPath("tailLines"), *n.TailLines, msgs[0]))
		}
	}
	if _, err := syntax.Parse(n.Pattern, syntax.Perl); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("pattern"), n.Pattern, err.Error()))
	}
	return errs
}

// safeServiceName: the kubelet's texts, "less than 100" included (its
// limit is 256).
func safeServiceName(s string) error {
	if len(s) > maxServiceLength {
		return fmt.Errorf("length must be less than 100")
	}
	if unsafeService.MatchString(s) {
		return fmt.Errorf("input contains unsupported characters")
	}
	return nil
}

// JournalArgs are the arguments the kubelet hands journalctl for the
// query's options and units, in its order.
func (n *Query) JournalArgs(units []string) []string {
	args := []string{"--utc", "--no-pager", "--output=short-precise"}
	if n.SinceTime != nil {
		args = append(args, "--since="+n.SinceTime.UTC().Format(journalDate))
	}
	if n.UntilTime != nil {
		args = append(args, "--until="+n.UntilTime.UTC().Format(journalDate))
	}
	if n.TailLines != nil {
		args = append(args, "--pager-end", fmt.Sprintf("--lines=%d", *n.TailLines))
	}
	for _, u := range units {
		if u != "" {
			args = append(args, "--unit="+u)
		}
	}
	if n.Pattern != "" {
		args = append(args, "--grep="+n.Pattern)
	}
	if n.Boot != nil {
		args = append(args, "--boot", strconv.Itoa(*n.Boot))
	}
	return args
}

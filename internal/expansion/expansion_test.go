package expansion

import "testing"

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "alpha", "B": "$(A)"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$(A)", "alpha"},
		{"x$(A)y$(A)", "xalphayalpha"},
		{"$(MISSING)", "$(MISSING)"},
		{"$$(A)", "$(A)"},
		{"$$", "$"},
		{"cost $5", "cost $5"},
		{"$(A", "$(A"},
		{"$(B)", "$(A)"}, // no recursive expansion
		{"trailing $", "trailing $"},
	} {
		if got := Expand(tc.in, lookup); got != tc.want {
			t.Errorf("Expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

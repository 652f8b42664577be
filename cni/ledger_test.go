package cni

import (
	"context"
	"reflect"
	"testing"
)

// TestLedger follows an attachment's record: written by Add, kept by a Del
// that had no config to DEL with, dropped by a Del that ran.
func TestLedger(t *testing.T) {
	ctx := context.Background()
	m, _ := fakeNetwork(t, "1.0.0")
	owners := func() map[natOwner]bool {
		t.Helper()
		o, err := m.owned.owners()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	a := Attachment{ID: "nrt-ledger", NetNS: fakeNetNS}
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	want := map[natOwner]bool{{"fake", a.ID}: true}
	if got := owners(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after Add: %v, want %v", got, want)
	}

	// A crash mid-ADD (nothing cached), then a restart whose config does
	// not load: the Del cannot release anything, so the record stays.
	crashed := Attachment{ID: "nrt-ledger-crashed"}
	if err := m.owned.add("fake", crashed.ID); err != nil {
		t.Fatal(err)
	}
	list := m.list
	m.list = nil
	if err := m.Del(ctx, crashed); err != nil {
		t.Fatal(err)
	}
	m.list = list
	want[natOwner{"fake", crashed.ID}] = true
	if got := owners(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a Del without config: %v, want %v", got, want)
	}

	for _, x := range []Attachment{a, crashed} {
		if err := m.Del(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if got := owners(); len(got) != 0 {
		t.Fatalf("after Del: %v, want none", got)
	}
}

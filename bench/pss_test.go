package main

import (
	"os"
	"slices"
	"testing"
)

func TestPSSOfThisProcess(t *testing.T) {
	kib, err := pssKiB(os.Getpid())
	if err != nil || kib <= 0 {
		t.Fatalf("PSS of this process: %d KiB, %v", kib, err)
	}
	if args := cmdline(os.Getpid()); len(args) == 0 || args[0] != os.Args[0] || !slices.Equal(args, os.Args) {
		t.Fatalf("cmdline %q, want %q", args, os.Args)
	}
	if _, err := pssKiB(1 << 30); err == nil {
		t.Fatal("a PID that cannot exist has a PSS")
	}
}

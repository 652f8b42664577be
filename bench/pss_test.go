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
	procs, err := processes()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(procs, func(p process) bool { return p.pid == os.Getpid() })
	if i < 0 || !slices.Equal(procs[i].args, os.Args) {
		t.Fatalf("this process not listed with its command line %q: %v", os.Args, i)
	}
	if _, err := pssKiB(1 << 30); err == nil {
		t.Fatal("a PID that cannot exist has a PSS")
	}
}

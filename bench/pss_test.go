package main

import (
	"os"
	"testing"
)

func TestPSSOfThisProcess(t *testing.T) {
	kib, err := pssKiB(os.Getpid())
	if err != nil || kib <= 0 {
		t.Fatalf("PSS of this process: %d KiB, %v", kib, err)
	}
	if _, err := pssKiB(1 << 30); err == nil {
		t.Fatal("a PID that cannot exist has a PSS")
	}
}

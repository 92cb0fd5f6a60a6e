package main

import (
	"os"
	"testing"
	"time"
)

func TestProcessCPUGrowsWithWork(t *testing.T) {
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	after, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100*time.Millisecond {
		t.Fatalf("CPU %v after 300 ms of spinning (%d loops)", after-before, x)
	}
}

func TestProcessCPUOfNoProcess(t *testing.T) {
	if _, err := processCPU(1 << 30); err == nil {
		t.Fatal("no error for a pid that does not exist")
	}
}

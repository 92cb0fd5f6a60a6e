package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneAgentGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	tuneAgentGC()
	if got := debug.SetGCPercent(100); got != agentGCPercent {
		t.Errorf("without GOGC: GC percent %d, want %d", got, agentGCPercent)
	}
	// With GOGC set, the runtime has read it at start; the agent keeps it.
	t.Setenv("GOGC", "200")
	debug.SetGCPercent(200)
	tuneAgentGC()
	if got := debug.SetGCPercent(100); got != 200 {
		t.Errorf("with GOGC=200: GC percent %d, want 200", got)
	}
}

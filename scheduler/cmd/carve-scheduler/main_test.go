package main

import (
	"testing"
)

// The command carve builds must be the scheduler, with its flags and the
// plan subcommand.
func TestSchedulerCommand(t *testing.T) {
	cmd := command()
	if cmd.Use != "carve-scheduler" {
		t.Errorf("command %q, want carve-scheduler", cmd.Use)
	}
	for _, f := range []string{"config", "leader-elect", "feature-gates"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
	plan, _, err := cmd.Find([]string{"plan"})
	if err != nil || plan.Name() != "plan" {
		t.Fatalf("plan subcommand: %v, %v", plan, err)
	}
}

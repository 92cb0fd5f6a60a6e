package main

import (
	"testing"

	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// The command carve builds must be the scheduler, with its flags.
func TestSchedulerCommand(t *testing.T) {
	cmd := app.NewSchedulerCommand()
	if cmd.Use != "kube-scheduler" {
		t.Errorf("command %q, want kube-scheduler", cmd.Use)
	}
	for _, f := range []string{"config", "leader-elect", "feature-gates"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
}

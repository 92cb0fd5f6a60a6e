// Package crash holds the fault points of the crash matrix: every step of
// prepare and unprepare can be made to kill the agent, so that tests prove a
// restarted agent neither leaks nor prepares twice.
package crash

import (
	"os"
	"syscall"
)

// AtEnv names the fault point at which the agent kills itself with
// SIGKILL, for the crash matrix (deploy/e2e): every step of prepare and
// unprepare has one, and the test asserts that a restarted agent neither
// leaks nor prepares twice. Unset in production.
const AtEnv = "CARVE_CRASH_AT"

var crashAt = os.Getenv(AtEnv)

// Point dies here, hard, when the fault point is the one asked for.
func Point(name string) {
	if crashAt != "" && crashAt == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered synchronously; never go on.
	}
}

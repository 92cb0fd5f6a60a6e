package prepare

import (
	"os"
	"syscall"
)

// CrashAtEnv names the fault point at which the agent kills itself with
// SIGKILL, for the crash matrix (deploy/e2e): every step of prepare and
// unprepare has one, and the test asserts that a restarted agent neither
// leaks nor prepares twice. Unset in production.
const CrashAtEnv = "CARVE_CRASH_AT"

var crashAt = os.Getenv(CrashAtEnv)

// CrashPoint is crashPoint for preparers, whose steps are fault points too.
func CrashPoint(name string) { crashPoint(name) }

// crashPoint dies here, hard, when the fault point is the one asked for.
func crashPoint(name string) {
	if crashAt != "" && crashAt == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered synchronously; never go on.
	}
}

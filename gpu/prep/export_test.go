package prep

import (
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// CrashAt makes the named fault point end the goroutine that reaches it,
// as SIGKILL ends the agent: nothing after it runs, no error path either.
// The returned func disarms it, for the restarted agent.
func CrashAt(t *testing.T, point string) (disarm func()) {
	t.Helper()
	old := crashPoint
	crashPoint = func(name string) {
		if name == point {
			runtime.Goexit()
		}
	}
	disarm = func() { crashPoint = old }
	t.Cleanup(disarm)
	return disarm
}

// RecordPath is where the preparer keeps the node record of a claim's MIG
// instance on a device.
func RecordPath(p *Preparer, claim types.UID, device string) string {
	path, err := p.recordPath(claim, device)
	if err != nil {
		panic(err)
	}
	return path
}

// Command pause is the sandbox ("infra") container of every pod on the local
// test cluster (deploy/cluster). It holds the pod's namespaces open, does
// nothing else, and exits cleanly on SIGTERM/SIGINT. As PID 1 of the pod's PID
// namespace (when the pod shares its process namespace) it also reaps
// orphaned children, which would otherwise stay zombies.
//
// It is the local replacement for registry.k8s.io/pause, which cannot be
// pulled here (no registry access). Build it static (CGO_ENABLED=0) so the
// image needs nothing but this binary; deploy/images/cluster-images.sh
// does that.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited; WNOHANG so a still-running child
		// does not block the signal loop (signals coalesce, so one SIGCHLD
		// may stand for several exits).
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

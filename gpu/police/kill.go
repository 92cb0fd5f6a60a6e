package police

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// Target is a process a tick found over its pod's limit, as it saw it.
type Target struct {
	PID int
	Pod types.UID
	// Start is the process's start time, field 22 of /proc/<pid>/stat.
	Start uint64
}

// ErrNotSame means the PID names another process than the one seen: the
// one seen has ended and its PID was reused.
var ErrNotSame = errors.New("the PID names another process now")

// KillChecked sends SIGKILL through a pidfd, and only to the process the
// tick saw. The pidfd is opened first and the process checked after: the
// pidfd holds one process whatever happens to its PID, and a process whose
// /proc/<pid>/stat shows the start time seen has held that PID since then,
// so it is the one the pidfd holds. Were the check made before the open, the
// process could end and its PID be reused between them. (Two processes
// with one PID and one start time would need the PID space to wrap within a
// clock tick, 10 ms.) The pod is checked again as well, from the cgroup.
//
// A process gone, or a PID that names another process, is an error that
// wraps syscall.ESRCH or ErrNotSame; nothing is signalled then.
func KillChecked(procRoot string, t Target) error {
	fd, err := unix.PidfdOpen(t.PID, 0)
	if err != nil {
		// Without pidfds (Linux before 5.3) there is no safe kill by PID:
		// the error says so rather than falling back to kill(2).
		return fmt.Errorf("pidfd of process %d: %w", t.PID, err)
	}
	defer unix.Close(fd)
	start, err := startTime(procRoot, t.PID)
	if err != nil {
		return fmt.Errorf("process %d after its pidfd was opened: %w", t.PID, err)
	}
	if start != t.Start {
		return fmt.Errorf("process %d started at tick %d, not %d as seen: %w", t.PID, start, t.Start, ErrNotSame)
	}
	pod, err := PodOf(procRoot, t.PID)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %w", err, syscall.ESRCH)
		}
		return fmt.Errorf("%w: %w", err, ErrNotSame)
	}
	if pod != t.Pod {
		return fmt.Errorf("process %d is in pod %s, not %s as seen: %w", t.PID, pod, t.Pod, ErrNotSame)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("SIGKILL to process %d: %w", t.PID, err)
	}
	return nil
}

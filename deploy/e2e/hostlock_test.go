package e2e

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf/nettest"
)

// make e2e runs the multi-node tests beside the single node's, in a second
// process of this package on the same two cores. A band on a rate or a
// latency (a share within 1% of its floor or ceiling, a ping's p99) holds
// only while the machine is not also starting a hundred pods or saturating
// the other cluster's links. Measured beside the multi-node tests,
// TestNodeBorrowingShares read a ping p99 of 5.9 ms (during
// TestMultiNodePoolAddresses) and a share alone at 0.988 of its ceiling
// (during TestMultiNodeRollout), each once in four runs; alone it never
// did. So a test that measures takes the host to itself (quietHost), and
// every other cluster test shares it (sharedHost), for the test's length,
// teardown included.
//
// The lock is a flock on the package's directory, which both processes run
// in (go test runs a package's binary there), so it leaves nothing behind
// and dies with its process. A turnstile, a flock on the directory above,
// keeps a measuring test that waits from being passed by the other
// process's next shared turns: a shared turn takes it before its own lock,
// and the measuring test holds it while it waits. No process waits for the
// turnstile while it holds the lock: a test that takes the host to itself
// after its shared turn gives the turn up first.
const (
	hostLockDir       = "."
	hostTurnstileDir  = ".."
	hostLockWaitToLog = time.Second
	// What the two clusters cost idle, both up: 10-20% of the cores,
	// measured here. A hundred pods being deleted after their test ended
	// take most of them for a minute: a share alone at 1G read 0.972 of its
	// ceiling then, with the lock held.
	hostSettledBusy = 0.35
	hostSettleMax   = 90 * time.Second
)

var hostLock struct {
	sync.Mutex
	fd        int
	exclusive bool
	held      bool
}

// quietHost gives the test the host to itself until it ends: no test of
// the other cluster's process runs meanwhile. A test calls it after
// clusterEnv or multiNodeCluster, which skip the tests of the other
// cluster: before them, a test the process skips waited its turn for
// nothing (91 s once).
func quietHost(t testing.TB) { lockHost(t, true) }

// sharedHost keeps measuring tests of the other process off the host until
// the test ends. clusterEnv and multiNodeCluster call it; where the test
// took the host to itself first, it does nothing.
func sharedHost(t testing.TB) { lockHost(t, false) }

func lockHost(t testing.TB, exclusive bool) {
	t.Helper()
	hostLock.Lock()
	defer hostLock.Unlock()
	if hostLock.held && (hostLock.exclusive || !exclusive) {
		return
	}
	start := time.Now()
	if hostLock.held {
		// An upgrade from the shared turn: let it go before the
		// turnstile. Holding it there deadlocked both processes (a CI
		// run hung until the multi-node tests' timeout): the other's
		// measuring test held the turnstile while it waited for this
		// shared lock to go, and this one waited for the turnstile.
		if err := flock(hostLock.fd, syscall.LOCK_UN); err != nil {
			t.Fatalf("host lock: %v", err)
		}
	}
	turnstile, err := openDir(hostTurnstileDir)
	if err != nil {
		t.Fatalf("host lock: %v", err)
	}
	defer syscall.Close(turnstile)
	if err := flock(turnstile, syscall.LOCK_EX); err != nil {
		t.Fatalf("host lock: turnstile: %v", err)
	}
	fd := hostLock.fd
	if !hostLock.held {
		if fd, err = openDir(hostLockDir); err != nil {
			t.Fatalf("host lock: %v", err)
		}
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := flock(fd, how); err != nil {
		syscall.Close(fd)
		t.Fatalf("host lock: %v", err)
	}
	// Closing the turnstile's descriptor (deferred) releases it.
	upgraded := hostLock.held
	hostLock.fd, hostLock.exclusive, hostLock.held = fd, exclusive, true
	if waited := time.Since(start); waited >= hostLockWaitToLog {
		t.Logf("waited %.1f s for the other cluster's test to end (exclusive: %v)", waited.Seconds(), exclusive)
	}
	if exclusive {
		settleHost(t)
	}
	if upgraded {
		// The shared turn's cleanup, registered first, releases it.
		return
	}
	t.Cleanup(func() {
		hostLock.Lock()
		defer hostLock.Unlock()
		_ = syscall.Close(hostLock.fd)
		hostLock.fd, hostLock.exclusive, hostLock.held = -1, false, false
	})
}

func openDir(path string) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

func flock(fd, how int) error {
	for {
		err := syscall.Flock(fd, how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// settleHost waits, up to hostSettleMax, until the cores were busy less
// than hostSettledBusy over a whole second: the lock stops the other
// process's next test, not what its last one left running (pods being
// deleted, containers stopping). Past the bound the test goes on, and says
// so.
func settleHost(t testing.TB) {
	t.Helper()
	start := time.Now()
	var busy float64
	for time.Since(start) < hostSettleMax {
		idle0, total0, err := nettest.CPUTimes()
		if err != nil {
			t.Logf("host settle: %v", err)
			return
		}
		time.Sleep(time.Second)
		idle1, total1, err := nettest.CPUTimes()
		if err != nil {
			t.Logf("host settle: %v", err)
			return
		}
		if total1 > total0 {
			busy = 1 - float64(idle1-idle0)/float64(total1-total0)
		}
		if busy < hostSettledBusy {
			if waited := time.Since(start); waited > 2*time.Second {
				t.Logf("waited %.1f s for the host to settle (%.0f%% busy over the last second)", waited.Seconds(), 100*busy)
			}
			return
		}
	}
	t.Logf("the host is still %.0f%% busy after %v: measuring anyway", 100*busy, hostSettleMax)
}

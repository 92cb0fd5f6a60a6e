package hook

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetns runs fn with the calling goroutine's thread in ns, for the calls
// that act on the thread's namespace (BPF attachment, moving links by
// name). The thread is restored and unlocked afterwards; a thread that
// could not be restored stays locked, so the Go runtime ends it with the
// goroutine rather than hand another goroutine a thread in the pod's
// namespace.
func InNetns(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		// Still in orig, unless setns half-failed: check before
		// handing the thread back.
		if cur, cerr := netns.Get(); cerr == nil {
			if cur.Equal(orig) {
				runtime.UnlockOSThread()
			}
			_ = cur.Close()
		}
		return fmt.Errorf("enter netns: %w", err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, fmt.Errorf("return to the original netns (the thread is retired): %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

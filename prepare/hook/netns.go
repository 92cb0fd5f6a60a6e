package hook

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetns runs fn with the calling goroutine's thread in ns, for the calls
// that act on the thread's namespace (BPF attachment, moving links by
// name). The thread is restored and unlocked afterwards.
func InNetns(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter netns: %w", err)
	}
	defer func() { _ = netns.Set(orig) }()
	return fn()
}

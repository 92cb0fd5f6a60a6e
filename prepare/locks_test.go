package prepare

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// A claim's lock is its own: holding claims a and b does not keep c out,
// holding a keeps a second holder of a out, and nothing is left behind.
func TestClaimLocksArePerClaim(t *testing.T) {
	var l claimLocks
	unlockAB := l.lock([]types.UID{"b", "a", "a"})
	for i := 0; i < 1000; i++ {
		// Any other uid, striped or hashed alike, goes straight in.
		l.lock([]types.UID{types.UID(rune('c' + i%20)), types.UID("x" + string(rune(i)))})()
	}
	got := make(chan struct{})
	go func() {
		defer close(got)
		l.lock([]types.UID{"a"})()
	}()
	select {
	case <-got:
		t.Fatal("a second holder of claim a got its lock while the first held it")
	default:
	}
	unlockAB()
	<-got
	if len(l.locks) != 0 {
		t.Errorf("locks left after every holder let go: %v", l.locks)
	}
}

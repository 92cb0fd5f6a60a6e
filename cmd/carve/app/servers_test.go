package app

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// An address the replaced agent still holds is served once it lets go; one
// that stays taken is fatal, not waited on for ever.
func TestListenEventually(t *testing.T) {
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := old.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	served := make(chan net.Listener, 1)
	fatal := make(chan error, 1)
	if err := listenEventually(ctx, &wg, addr, "test", func(err error) { fatal <- err }, func(ln net.Listener) { served <- ln }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	select {
	case <-served:
		t.Fatal("served while the address was held")
	default:
	}
	old.Close()
	select {
	case ln := <-served:
		ln.Close()
	case err := <-fatal:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("not served 5 s after the address was let go")
	}

	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	saved := addrWait
	addrWait = time.Second
	defer func() { addrWait = saved }()
	if err := listenEventually(ctx, &wg, held.Addr().String(), "test", func(err error) { fatal <- err }, func(ln net.Listener) { served <- ln }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-fatal:
		t.Logf("fatal, as it should be: %v", err)
	case <-served:
		t.Fatal("served an address another listener holds")
	case <-time.After(5 * time.Second):
		t.Fatal("no fatal error for an address held past the wait")
	}
	cancel()
	wg.Wait()
}

package bpf

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Pod guards taken from the pool, and those loaded on demand once it is
// empty, each hold their own share: its frames pass, another share's MAC
// is dropped. Each guard's data are frozen once pinned, so not even the
// agent can rewrite them. The pool fills again after a quiet spell, and
// Close releases the guards not taken.
func TestPooledPodGuards(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	if err := s.PreloadPodGuards(0, time.Millisecond); err == nil {
		t.Error("a pool of 0 guards: no error")
	}
	const size = 4
	if err := s.PreloadPodGuards(size, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.PreloadPodGuards(size, 20*time.Millisecond); err == nil {
		t.Error("preloading twice: no error")
	}
	full := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(s.pool.ready) < size {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d guards in the pool after 5s, want %d", what, len(s.pool.ready), size)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	full("first fill")
	first := pooledIDs(t, s)

	// More guards than the pool holds, at once: the last ones are loaded
	// on demand.
	const shares = size + 3
	macs := make([]net.HardwareAddr, shares)
	for i := range macs {
		macs[i] = net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, byte(i + 1)}
		name := "cvpool" + string(rune('a'+i))
		if err := s.PinPodGuard(name, PodShare{Parent: 7, MAC: macs[i].String()}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = UnpinPodGuard(dir, name) }()
	}
	for i := range macs {
		name := "cvpool" + string(rune('a'+i))
		prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(dir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		other := macs[(i+1)%shares]
		if ret, _ := runCtx(t, prog, ipFrame(mac2, macs[i], "10.9.0.5", "10.9.0.1", false), skbCtx{Ifindex: 1}); ret != tcxNext {
			t.Errorf("guard %d, its share's own frame: verdict %d, want passed", i, ret)
		}
		if ret, _ := runCtx(t, prog, ipFrame(mac2, other, "10.9.0.5", "10.9.0.1", false), skbCtx{Ifindex: 1}); ret != tcActShot {
			t.Errorf("guard %d, a frame from share %d's MAC: verdict %d, want dropped", i, (i+1)%shares, ret)
		}
		if i == 0 {
			// Taken from the full pool, not loaded on demand.
			if info, err := prog.Info(); err != nil {
				t.Fatal(err)
			} else if id, _ := info.ID(); !first[id] {
				t.Errorf("the first guard pinned is program %d, none of the pool's %v", id, first)
			}
		}
		data := guardDataMap(t, prog)
		if err := data.Update(uint32(0), make([]byte, data.ValueSize()), ebpf.UpdateAny); !errors.Is(err, unix.EPERM) {
			t.Errorf("guard %d: rewriting its pinned data: %v, want EPERM (frozen)", i, err)
		}
		data.Close()
		prog.Close()
	}

	full("after the prepares")
	pooled := pooledIDs(t, s)
	s.Close()
	closed = true
	deadline := time.Now().Add(2 * time.Second)
	for id := range pooled {
		for {
			p, err := ebpf.NewProgramFromID(id)
			if err != nil {
				break
			}
			p.Close()
			if time.Now().After(deadline) {
				t.Errorf("pooled guard %d still loaded 2s after Close", id)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// pooledIDs are the programs in s's full pool: taken out and put back,
// which the filler, its pool full, does not see.
func pooledIDs(t *testing.T, s *Shaper) map[ebpf.ProgramID]bool {
	t.Helper()
	ids := map[ebpf.ProgramID]bool{}
	for range cap(s.pool.ready) {
		g := <-s.pool.ready
		info, err := g.prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids[id] = true
		s.pool.ready <- g
	}
	return ids
}

// guardDataMap opens the data map of the pod guard prog.
func guardDataMap(t *testing.T, prog *ebpf.Program) *ebpf.Map {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		if mi, err := m.Info(); err == nil && mi.Name == guardDataSection {
			return m
		}
		m.Close()
	}
	t.Fatalf("pod guard: no map %s among %v", guardDataSection, ids)
	return nil
}

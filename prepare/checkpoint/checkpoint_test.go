package checkpoint_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/checkpoint"
)

// record stands in for the driver's claim record: the checkpoint stores any
// JSON-encodable value per claim.
type record struct {
	UID   types.UID `json:"uid"`
	State string    `json:"state"`
}

func open(t *testing.T, dir, bootID string, onCorrupt func(string, error)) *checkpoint.Checkpoint[record] {
	t.Helper()
	cp, err := checkpoint.Open[record](dir, bootID, onCorrupt)
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func put(t *testing.T, cp *checkpoint.Checkpoint[record], uid string) {
	t.Helper()
	if err := cp.Update(func(recs *checkpoint.Records[record]) error {
		recs.Set(types.UID(uid), record{UID: types.UID(uid), State: "completed"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointRoundTripAndFormat(t *testing.T) {
	dir := t.TempDir()
	cp := open(t, dir, "boot-1", nil)
	put(t, cp, "a")
	raw, err := os.ReadFile(cp.Path())
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version  int    `json:"version"`
		Checksum string `json:"checksum"`
	}
	if err := json.Unmarshal(raw, &f); err != nil || f.Version != checkpoint.Version || !strings.HasPrefix(f.Checksum, "sha256:") {
		t.Errorf("file = %s", raw)
	}
	cp2 := open(t, dir, "boot-1", nil)
	if recs, err := cp2.Read(); err != nil || recs["a"].State != "completed" {
		t.Errorf("reopened: %v %v", recs, err)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".checkpoint.json.tmp-*")); len(matches) != 0 {
		t.Errorf("temp files left: %v", matches)
	}
}

// A corrupt or foreign checkpoint is reported and kept aside; the agent
// goes on from empty rather than crash-looping.
func TestCorruptCheckpointKeptAside(t *testing.T) {
	for name, mangle := range map[string]func([]byte) []byte{
		"garbage":     func([]byte) []byte { return []byte("{not json") },
		"torn":        func(b []byte) []byte { return b[:len(b)/2] },
		"edited":      func(b []byte) []byte { return []byte(strings.Replace(string(b), `"completed"`, `"started"`, 1)) },
		"bit flipped": func(b []byte) []byte { return []byte(strings.Replace(string(b), `"uid":"a"`, `"uid":"b"`, 1)) },
		"past":        func(b []byte) []byte { return []byte(strings.Replace(string(b), `"version":1`, `"version":0`, 1)) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			var reported []string
			cp := open(t, dir, "boot-1", func(kept string, err error) { reported = append(reported, kept+": "+err.Error()) })
			put(t, cp, "a")
			raw, _ := os.ReadFile(cp.Path())
			bad := mangle(raw)
			if string(bad) == string(raw) {
				t.Fatalf("mangling changed nothing in %s", raw)
			}
			if err := os.WriteFile(cp.Path(), bad, 0o600); err != nil {
				t.Fatal(err)
			}
			recs, err := cp.Read()
			if err != nil || len(recs) != 0 {
				t.Fatalf("read = %v, %v; want empty and no error", recs, err)
			}
			if len(reported) != 1 {
				t.Fatalf("reports = %v", reported)
			}
			kept, _ := filepath.Glob(filepath.Join(dir, "checkpoint.json.corrupt-*"))
			if len(kept) != 1 {
				t.Fatalf("kept = %v", kept)
			}
			if b, _ := os.ReadFile(kept[0]); string(b) != string(bad) {
				t.Errorf("kept copy differs from the corrupt file")
			}
		})
	}
}

func TestCheckpointFromAnotherBootIsDropped(t *testing.T) {
	dir := t.TempDir()
	cp := open(t, dir, "boot-1", nil)
	put(t, cp, "a")
	after := open(t, dir, "boot-2", nil)
	if recs, err := after.Read(); err != nil || len(recs) != 0 {
		t.Errorf("after reboot: %v %v", recs, err)
	}
}

// A checkpoint written by a newer carve (found after a rollback) is neither
// read nor kept aside: the agent refuses to start, saying why, rather than
// start empty and forget every prepared share.
func TestNewerCheckpointIsRefused(t *testing.T) {
	dir := t.TempDir()
	reported := 0
	cp := open(t, dir, "boot-1", func(string, error) { reported++ })
	put(t, cp, "a")
	raw, _ := os.ReadFile(cp.Path())
	newer := []byte(strings.Replace(string(raw), `"version":1`, `"version":2`, 1))
	if err := os.WriteFile(cp.Path(), newer, 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := cp.Read()
	if err == nil || !strings.Contains(err.Error(), "version 2") || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("read = %v, %v; want an error naming the newer version", recs, err)
	}
	if err := cp.Update(func(*checkpoint.Records[record]) error { return nil }); err == nil {
		t.Error("an update over a newer checkpoint succeeded")
	}
	if b, _ := os.ReadFile(cp.Path()); string(b) != string(newer) {
		t.Error("the newer checkpoint was changed")
	}
	if kept, _ := filepath.Glob(filepath.Join(dir, "checkpoint.json.corrupt-*")); len(kept) != 0 || reported != 0 {
		t.Errorf("the newer checkpoint was kept aside as corrupt: %v (%d reports)", kept, reported)
	}
}

// Many writers, each with its own Checkpoint (as two agents during a rolling
// update are), never lose an update: the flock orders them.
func TestConcurrentWritersLoseNothing(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cp := open(t, dir, "boot-1", nil)
			for i := 0; i < 10; i++ {
				put(t, cp, fmt.Sprintf("w%d-%d", w, i))
			}
		}(w)
	}
	wg.Wait()
	cp := open(t, dir, "boot-1", nil)
	if recs, _ := cp.Read(); len(recs) != 80 {
		t.Errorf("%d records, want 80", len(recs))
	}
}

// The boot id is the running kernel's: a fixture root without procfs falls
// back to the agent's own /proc, and a root that has the file (a host root
// mounted at /host) is read.
func TestReadBootID(t *testing.T) {
	own, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("this kernel has no boot id: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := checkpoint.ReadBootID(t.TempDir())
	if err != nil || got != strings.TrimSpace(string(own)) {
		t.Errorf("fixture root without procfs: got %q, %v; want the running kernel's %q", got, err, strings.TrimSpace(string(own)))
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc/sys/kernel/random"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/sys/kernel/random/boot_id"), []byte("boot-under-root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := checkpoint.ReadBootID(root); err != nil || got != "boot-under-root" {
		t.Errorf("root with a boot id: got %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/sys/kernel/random/boot_id"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.ReadBootID(root); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty boot id: got %v, want an error naming it", err)
	}
}

// The caller that writes a group returns once its own group is on disk: the
// group queued meanwhile is written by one of its own callers, not by it.
func TestWriterReturnsAfterItsOwnGroup(t *testing.T) {
	cp := open(t, t.TempDir(), "boot", nil)
	aRunning, aRelease := make(chan struct{}), make(chan struct{})
	bRunning, bRelease := make(chan struct{}), make(chan struct{})
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() {
		aDone <- cp.Update(func(recs *checkpoint.Records[record]) error {
			close(aRunning)
			<-aRelease
			recs.Set("a", record{UID: "a"})
			return nil
		})
	}()
	<-aRunning
	go func() {
		bDone <- cp.Update(func(recs *checkpoint.Records[record]) error {
			close(bRunning)
			<-bRelease
			recs.Set("b", record{UID: "b"})
			return nil
		})
	}()
	// b is queued behind a's group before a's group is released.
	for cp.Queued() == 0 {
		runtime.Gosched()
	}
	close(aRelease)
	<-bRunning // b's group is being written, and blocks
	select {
	case err := <-aDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's Update did not return while b's group was being written: a is writing b's group")
	}
	close(bRelease)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	recs, err := cp.Read()
	if err != nil || len(recs) != 2 {
		t.Fatalf("records %v, %v; want a and b", recs, err)
	}
}

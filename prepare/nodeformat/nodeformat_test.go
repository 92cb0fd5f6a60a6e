package nodeformat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A fresh node gets the current format; a 0.1.0 node (a checkpoint, no
// format.json) is migrated from 1; a newer state it can serve is left as it
// is; one it cannot is refused, unchanged, with a message that says what
// to do; a damaged record is an error naming it.
func TestPrepare(t *testing.T) {
	write := func(t *testing.T, dir, name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(t *testing.T, dir string) string {
		t.Helper()
		raw, err := os.ReadFile(Path(dir))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(raw))
	}
	current := fmt.Sprintf(`{"version":%d,"minReader":%d,"writtenBy":"test"}`, Current, MinReader)

	fresh := t.TempDir()
	if found, err := Prepare(fresh, "", "test"); err != nil || found != nil {
		t.Errorf("fresh node: %v, %v", found, err)
	}
	if got := read(t, fresh); got != current {
		t.Errorf("fresh node wrote %s, want %s", got, current)
	}

	old := t.TempDir()
	write(t, old, "checkpoint.json", "{}")
	if found, err := Prepare(old, "", "test"); err != nil || found == nil || found.Version != 1 {
		t.Errorf("0.1.0 node: %+v, %v; want version 1 found", found, err)
	}
	if got := read(t, old); got != current {
		t.Errorf("0.1.0 node wrote %s, want %s", got, current)
	}

	servable := t.TempDir()
	newer := fmt.Sprintf(`{"version":%d,"minReader":%d,"writtenBy":"9.0.0"}`, Current+5, Current)
	write(t, servable, "format.json", newer)
	if found, err := Prepare(servable, "", "test"); err != nil || found.Version != Current+5 {
		t.Errorf("a newer state this agent can serve: %+v, %v", found, err)
	}
	if got := read(t, servable); got != newer {
		t.Errorf("a newer state was rewritten: %s", got)
	}

	tooNew := t.TempDir()
	newest := fmt.Sprintf(`{"version":%d,"minReader":%d,"writtenBy":"9.0.0"}`, Current+5, Current+1)
	write(t, tooNew, "format.json", newest)
	_, err := Prepare(tooNew, "", "test")
	if !errors.Is(err, ErrTooNew) || !strings.Contains(err.Error(), "9.0.0") || !strings.Contains(err.Error(), "run the newer carve") {
		t.Errorf("a state this agent cannot serve: %v", err)
	}
	if got := read(t, tooNew); got != newest {
		t.Errorf("a refused state was changed: %s", got)
	}

	damaged := t.TempDir()
	write(t, damaged, "format.json", `{"version":0}`)
	if _, err := Prepare(damaged, "", "test"); err == nil || !strings.Contains(err.Error(), "format.json") {
		t.Errorf("a damaged format record: %v", err)
	}
}

// Every format before the current one has its migration.
func TestEveryOlderFormatMigrates(t *testing.T) {
	for v := 1; v < Current; v++ {
		if migrations[v] == nil {
			t.Errorf("no migration from format %d", v)
		}
	}
}

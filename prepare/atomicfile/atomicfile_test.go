package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteFrom replaces a file with what it reads, with the mode asked; a
// reader that fails leaves the old content and no temporary file.
func TestWriteFrom(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bin")
	if err := WriteFrom(path, strings.NewReader("first"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // more than one buffer
	if err := WriteFrom(path, strings.NewReader(big), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != big {
		t.Fatalf("content after the second write: %d bytes, err %v; want %d bytes", len(got), err, len(big))
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v (err %v), want 0755", st.Mode().Perm(), err)
	}
	broken := io.MultiReader(strings.NewReader("partial"), errReader{})
	if err := WriteFrom(path, broken, 0o755); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a failing reader: err %v, want one naming %s", err, path)
	}
	if got, _ := os.ReadFile(path); string(got) != big {
		t.Errorf("a failing reader changed the file: %d bytes", len(got))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files left beside it: %v", entries)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

// Replace makes a file, replaces it, leaves nothing beside it, and refuses
// to put a file where a directory is, as a rename would.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	for _, content := range []string{"first", "second, longer", "third"} {
		if err := Replace(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("content %q (err %v), want %q", got, err, content)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("mode %v (err %v), want 0600", st.Mode().Perm(), err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("files left beside it: %v", entries)
		}
	}
	sub := filepath.Join(dir, "a-directory")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Replace(sub, []byte("x"), 0o600); err == nil {
		t.Error("Replace put a file where a directory was")
	}
	if fi, err := os.Stat(sub); err != nil || !fi.IsDir() {
		t.Errorf("the directory is gone: %v %v", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("files left beside them: %v", entries)
	}
}

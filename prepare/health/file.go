package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// FileName is the file in the agent's state directory where it writes every
// tainted device's health after each change, for `carve shares`.
const FileName = "health.json"

// File is the health file: the tainted devices by name. Its JSON keys are a
// contract (`carve shares -o json` shows them).
type File struct {
	Updated time.Time            `json:"updated"`
	Devices map[string]FileEntry `json:"devices"`
}

// FileEntry is a tainted device in the health file.
type FileEntry struct {
	Kind     string `json:"kind,omitempty"`
	Severity string `json:"severity"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	// Taint is key=value:effect.
	Taint   string    `json:"taint,omitempty"`
	Since   time.Time `json:"since,omitzero"`
	ClearAt time.Time `json:"clearAt,omitzero"`
	Flaps   int       `json:"flaps,omitempty"`
	Changes int       `json:"changes,omitempty"`
	// Gone is true for a device discovery no longer finds.
	Gone bool `json:"gone,omitempty"`
}

// WriteFile replaces the health file in dir.
func WriteFile(dir string, f File) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode health file: %w", err)
	}
	if err := atomicfile.Replace(filepath.Join(dir, FileName), b, 0o644); err != nil {
		return fmt.Errorf("write health file: %w", err)
	}
	return nil
}

// ReadFile reads the health file in dir; an empty File where the agent
// wrote none.
func ReadFile(dir string) (File, error) {
	var f File
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("read health file: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("health file %s: %w", filepath.Join(dir, FileName), err)
	}
	return f, nil
}

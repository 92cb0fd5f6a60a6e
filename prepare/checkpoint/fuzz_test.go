package checkpoint_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/checkpoint"
)

// fuzzRecord has the shapes of the driver's claim record: strings, a time,
// raw JSON, lists, a pointer.
type fuzzRecord struct {
	UID     types.UID         `json:"uid"`
	State   string            `json:"state"`
	Undo    []json.RawMessage `json:"undo,omitempty"`
	Share   *types.UID        `json:"share,omitempty"`
	Minors  []uint16          `json:"minors,omitempty"`
	Updated time.Time         `json:"updated"`
}

// seal wraps data as a checkpoint file of this version with its checksum,
// so that fuzzing reaches the payload's decoding past the checksum.
func seal(version int, data []byte) []byte {
	sum := sha256.Sum256(data)
	out, err := json.Marshal(map[string]any{"version": version, "checksum": "sha256:" + hex.EncodeToString(sum[:]), "data": json.RawMessage(data)})
	if err != nil {
		// data is not JSON: written as the file would be.
		return []byte(`{"version":1,"checksum":"sha256:` + hex.EncodeToString(sum[:]) + `","data":` + string(data) + `}`)
	}
	return out
}

// FuzzCheckpointRead opens a checkpoint file of any content (sealed: the
// content as the checksummed payload of a file of this version). Whatever
// it holds, reading it gives one of: the records, every one of them; an
// empty set with the file kept aside, byte for byte, and reported; or, for
// a newer version only, an error with the file left alone. Never a panic,
// never part of a file. What is read is written and read back the same.
func FuzzCheckpointRead(f *testing.F) {
	const boot = "boot-1"
	good := `{"bootID":"boot-1","claims":{"a":{"uid":"a","state":"completed","undo":[{"x":1},null],"share":"s","minors":[1,65535],"updated":"2025-01-02T03:04:05.123456789+01:00"}}}`
	for _, tc := range []struct {
		content string
		sealed  bool
	}{
		{good, true},
		{`{"bootID":"boot-0","claims":{"a":{"uid":"a"}}}`, true},
		{`{"bootID":"boot-1","claims":null}`, true},
		{`{"bootID":"boot-1","claims":{"a":{"uid":"a"},"a":{"uid":"b","state":"x"}}}`, true},
		{`{"bootID":"boot-1","claims":{"a":{"minors":[65536]}}}`, true},
		{`{"bootID":"boot-1","claims":{"a":{"minors":[-1]}},"b":{"updated":"yesterday"}}`, true},
		{`{"bootID":"boot-1","claims":{"a":{"uid":"a"},"b":7}}`, true},
		{`{"bootID":"boot-1","claims":{"\u0000\n":{"state":"\u001b[2J"}},"unknown":1}`, true},
		{`{"bootID":"boot-1","claims":` + strings.Repeat("[", 3000) + strings.Repeat("]", 3000) + `}`, true},
		{`null`, true},
		{`{"version":1,"checksum":"sha256:00","data":{}}`, false},
		{`{"version":2,"checksum":"","data":{}}`, false},
		{`{"version":9223372036854775807}`, false},
		{`{"version":99999999999999999999}`, false},
		{`{"version":0,"checksum":"sha256:74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b","data":null}`, false},
		{`{"version":1,"version":2}`, false},
		{string(seal(1, []byte(good)))[:60], false},
		{"", false}, {"\x00", false},
	} {
		f.Add([]byte(tc.content), tc.sealed)
	}
	f.Fuzz(func(t *testing.T, content []byte, sealed bool) {
		if sealed {
			content = seal(1, content)
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "checkpoint.json")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		var kept []string
		var reasons []error
		cp, err := checkpoint.Open[fuzzRecord](dir, boot, func(k string, err error) { kept, reasons = append(kept, k), append(reasons, err) })
		if err != nil {
			t.Fatal(err)
		}
		recs, err := cp.Read()
		if err != nil {
			if !errors.Is(err, checkpoint.ErrNewerVersion) {
				t.Fatalf("Read of %q: %v, which is not a newer version", content, err)
			}
			if recs != nil || len(kept) != 0 {
				t.Fatalf("a newer version gave %v and was kept aside: %v", recs, kept)
			}
			if b, _ := os.ReadFile(path); !bytes.Equal(b, content) {
				t.Fatal("a newer version's file was changed")
			}
			return
		}
		if recs == nil {
			t.Fatal("nil records without an error")
		}
		switch len(kept) {
		case 0:
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("read without a report, but the file is gone: %v", err)
			}
		case 1:
			if len(recs) != 0 {
				t.Fatalf("a corrupt file (%v) gave %d records", reasons[0], len(recs))
			}
			if b, err := os.ReadFile(kept[0]); err != nil || !bytes.Equal(b, content) {
				t.Fatalf("the corrupt file was not kept aside as it was: %v", err)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("the corrupt file is still in place: %v", err)
			}
		default:
			t.Fatalf("reported %d times: %v", len(kept), reasons)
		}
		// A record is all of a record: the payload's own decoding of it.
		if len(recs) > 0 {
			var f struct {
				Data json.RawMessage `json:"data"`
			}
			var data struct {
				BootID string                        `json:"bootID"`
				Claims map[types.UID]json.RawMessage `json:"claims"`
			}
			if err := json.Unmarshal(content, &f); err != nil || json.Unmarshal(f.Data, &data) != nil {
				t.Fatalf("read records from a file that does not decode: %q", content)
			}
			if data.BootID != boot || len(data.Claims) != len(recs) {
				t.Fatalf("read %d records of boot %q; the file has %d", len(recs), data.BootID, len(data.Claims))
			}
		}
		// Written (with a change that is undone) and read again by
		// another agent, the records are the same.
		want, err := json.Marshal(recs)
		if err != nil {
			t.Fatalf("encode %v: %v", recs, err)
		}
		if err := cp.Update(func(m *checkpoint.Records[fuzzRecord]) error {
			m.Set("fuzz-probe", fuzzRecord{})
			m.Delete("fuzz-probe")
			return nil
		}); err != nil {
			t.Fatalf("write back: %v", err)
		}
		again, err := checkpoint.Open[fuzzRecord](dir, boot, func(_ string, err error) { t.Fatalf("what was written is corrupt: %v", err) })
		if err != nil {
			t.Fatal(err)
		}
		back, err := again.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(back); !bytes.Equal(got, want) {
			t.Fatalf("records changed on a write and read:\n%s\n%s", want, got)
		}
	})
}

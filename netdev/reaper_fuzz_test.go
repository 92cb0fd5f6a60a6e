package netdev

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/checkpoint"
)

// FuzzReaperQueue resumes the reaper's on-disk queue (a checkpoint of
// reapItems) from a file of any content, sealed with a valid checksum when
// sealed is set so that the items themselves are fuzzed. resume hands the
// worker every queued item, whole, and nothing else; items of one share are
// merged without losing what either knew; a corrupt queue resumes nothing.
// The worker is never started (the reaper is marked running): nothing here
// touches the kernel.
func FuzzReaperQueue(f *testing.F) {
	const boot = "boot-1"
	for _, tc := range []struct {
		content string
		sealed  bool
	}{
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1","parent":"eth1","link":"cv1","egressMinor":2,"ingressMinor":3},"k2":{"key":"k2","link":"cv2"}}}`, true},
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1","link":"cv1","egressMinor":2},"x":{"key":"k1","parent":"eth1","link":"cv1","ingressMinor":3}}}`, true},
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1","egressMinor":65536}}}`, true},
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1","egressMinor":-1}}}`, true},
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1","link":"../../../etc/x","parent":"\u0000"}}}`, true},
		{`{"bootID":"boot-1","claims":{"k1":{"key":"k1"},"k1":{"key":"k2"}}}`, true},
		{`{"bootID":"boot-1","claims":{"":{}}}`, true},
		{`{"bootID":"boot-0","claims":{"k1":{"key":"k1"}}}`, true},
		{`{"bootID":"boot-1","claims":[]}`, true},
		{`{"version":1,"checksum":"sha256:","data":{}}`, false},
		{`{"version":2}`, false},
		{``, false},
	} {
		f.Add([]byte(tc.content), tc.sealed)
	}
	f.Fuzz(func(t *testing.T, content []byte, sealed bool) {
		if sealed {
			sum := sha256.Sum256(content)
			content = []byte(`{"version":1,"checksum":"sha256:` + hex.EncodeToString(sum[:]) + `","data":` + string(content) + `}`)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), content, 0o600); err != nil {
			t.Fatal(err)
		}
		corrupt := 0
		q, err := checkpoint.Open[reapItem](dir, boot, func(string, error) { corrupt++ })
		if err != nil {
			t.Fatal(err)
		}
		r := &reaper{queue: q, pending: map[string]reapItem{}, inflight: map[string]chan struct{}{}, running: true}
		r.idle = sync.NewCond(&r.mu)
		items, err := r.resume()
		if err != nil {
			if !errors.Is(err, checkpoint.ErrNewerVersion) || items != nil || len(r.pending) != 0 {
				t.Fatalf("resume of %q: %v, %v queued", content, err, r.pending)
			}
			return
		}
		// What the file says, decoded on its own.
		var file struct {
			Data json.RawMessage `json:"data"`
		}
		var data struct {
			BootID string                 `json:"bootID"`
			Claims map[types.UID]reapItem `json:"claims"`
		}
		fileOK := json.Unmarshal(content, &file) == nil && json.Unmarshal(file.Data, &data) == nil
		if corrupt > 0 || !fileOK || data.BootID != boot {
			if len(items) != 0 || len(r.pending) != 0 {
				t.Fatalf("resumed %v from a queue that is corrupt (%d) or of another boot", items, corrupt)
			}
			return
		}
		if len(items) != len(data.Claims) {
			t.Fatalf("resumed %d items of the %d queued", len(items), len(data.Claims))
		}
		byKey := map[string][]reapItem{}
		for _, it := range items {
			byKey[it.Key] = append(byKey[it.Key], it)
		}
		for _, want := range data.Claims {
			if len(byKey[want.Key]) == 0 {
				t.Fatalf("queued %+v not resumed", want)
			}
		}
		if len(r.pending) != len(byKey) {
			t.Fatalf("%d shares queued, %d pending", len(byKey), len(r.pending))
		}
		for key, its := range byKey {
			got, ok := r.pending[key]
			if !ok || got.Key != key {
				t.Fatalf("share %q not pending: %+v", key, r.pending)
			}
			// Only what carve would have queued: the link named from
			// the key, a parent that is an interface name, minors in
			// the share classes' range.
			if got.Link != LinkName(key) || (got.Parent != "" && !validLinkName(got.Parent)) ||
				(got.EgressMinor != 0 && (got.EgressMinor < minMinor || got.EgressMinor >= maxMinor)) ||
				(got.IngressMinor != 0 && (got.IngressMinor < minMinor || got.IngressMinor >= maxMinor)) {
				t.Fatalf("share %q: resumed %+v, beyond what carve queues", key, got)
			}
			// Merged: each field is one of the share's items', and
			// what one of them knew is not lost (the link is the
			// key's, never merged).
			for _, field := range []struct {
				get    func(reapItem) any
				merged bool
			}{
				{func(i reapItem) any { return i.Link }, false},
				{func(i reapItem) any { return i.Parent }, true},
				{func(i reapItem) any { return i.EgressMinor }, true},
				{func(i reapItem) any { return i.IngressMinor }, true},
			} {
				seen, zero := false, field.get(reapItem{})
				for _, it := range its {
					seen = seen || field.get(it) == field.get(got)
					if field.merged && field.get(it) != zero && field.get(got) == zero {
						t.Fatalf("share %q: merging %+v lost what one knew: %+v", key, its, got)
					}
				}
				if !seen {
					t.Fatalf("share %q: %+v is none of %+v", key, got, its)
				}
			}
		}
		// An item merged with itself, or with another share's, is itself.
		for _, it := range items {
			if it.merge(it) != it || it.merge(reapItem{Key: it.Key + "x", Parent: "p", EgressMinor: 1}) != it {
				t.Fatalf("merge of %+v", it)
			}
		}
		// Enqueued again by a second unprepare that knows less, a queued
		// share keeps on disk what it had.
		for _, it := range items {
			on, err := q.Read()
			if err != nil {
				t.Fatal(err)
			}
			before := on[types.UID(it.Key)]
			if err := r.enqueue(reapItem{Key: it.Key, Link: it.Link}); err != nil {
				t.Fatalf("enqueue %+v: %v", it, err)
			}
			if on, err = q.Read(); err != nil {
				t.Fatal(err)
			}
			after := on[types.UID(it.Key)]
			if before.Key == it.Key && (after.Parent != before.Parent || after.EgressMinor != before.EgressMinor || after.IngressMinor != before.IngressMinor) {
				t.Fatalf("enqueue of %+v turned the queued %+v into %+v", it, before, after)
			}
			if after.Key != it.Key || after.Link != it.Link {
				t.Fatalf("enqueue of %+v queued %+v", it, after)
			}
		}
	})
}

package checkpoint_test

import (
	"errors"
	"maps"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/checkpoint"
)

// A write encodes only the records that changed and copies the others'
// earlier encodings: after a run of sets, replacements, deletions and
// failed updates, a second process reading the file finds exactly the
// records the updates that succeeded left, each as last set.
func TestIncrementalWritesMatchTheRecords(t *testing.T) {
	dir := t.TempDir()
	cp := open(t, dir, "boot-1", nil)
	want := map[types.UID]record{}
	set := func(uid types.UID, state string) func(*checkpoint.Records[record]) error {
		return func(r *checkpoint.Records[record]) error {
			r.Set(uid, record{UID: uid, State: state})
			return nil
		}
	}
	failed := errors.New("refused")
	steps := []struct {
		fn  func(*checkpoint.Records[record]) error
		ok  bool
		did func()
	}{
		{set("a", "started"), true, func() { want["a"] = record{UID: "a", State: "started"} }},
		{set("b", "started"), true, func() { want["b"] = record{UID: "b", State: "started"} }},
		{set("a", "completed"), true, func() { want["a"] = record{UID: "a", State: "completed"} }},
		// A failed update's set and delete leave nothing, in the file or
		// in what the next write copies.
		{func(r *checkpoint.Records[record]) error {
			r.Set("b", record{UID: "b", State: "poisoned"})
			r.Delete("a")
			r.Set("c", record{UID: "c", State: "poisoned"})
			return failed
		}, false, func() {}},
		{set("d", "completed"), true, func() { want["d"] = record{UID: "d", State: "completed"} }},
		{func(r *checkpoint.Records[record]) error { r.Delete("b"); return nil }, true, func() { delete(want, "b") }},
		// Deleted and set again in one update: the set stands.
		{func(r *checkpoint.Records[record]) error {
			r.Delete("d")
			r.Set("d", record{UID: "d", State: "again"})
			return nil
		}, true, func() { want["d"] = record{UID: "d", State: "again"} }},
	}
	for i, s := range steps {
		err := cp.Update(s.fn)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: Update returned %v", i, err)
		}
		s.did()
		// Another process's view: the file alone.
		got, err := open(t, dir, "boot-1", func(_ string, err error) { t.Fatalf("step %d: the file is corrupt: %v", i, err) }).Read()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: the file holds %v, want %v", i, got, want)
		}
	}
}

// What an update sees is the records with its own changes over them.
func TestRecordsSeeTheirOwnChanges(t *testing.T) {
	cp := open(t, t.TempDir(), "boot-1", nil)
	put(t, cp, "a")
	put(t, cp, "b")
	if err := cp.Update(func(r *checkpoint.Records[record]) error {
		r.Delete("a")
		r.Delete("nothing")
		r.Set("c", record{UID: "c"})
		r.Set("b", record{UID: "b", State: "replaced"})
		if _, ok := r.Get("a"); ok {
			t.Error("a deleted record is still there")
		}
		if got, ok := r.Get("b"); !ok || got.State != "replaced" {
			t.Errorf("b is %v, %v; want the replacement", got, ok)
		}
		all := map[types.UID]record{}
		for uid, rec := range r.All() {
			if _, twice := all[uid]; twice {
				t.Errorf("%s yielded twice", uid)
			}
			all[uid] = rec
		}
		want := map[types.UID]record{"b": {UID: "b", State: "replaced"}, "c": {UID: "c"}}
		if !reflect.DeepEqual(all, want) || r.Len() != len(want) {
			t.Errorf("All gives %v and Len %d, want %v", all, r.Len(), want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Lookup gives the records asked for that exist, and only those.
func TestLookup(t *testing.T) {
	cp := open(t, t.TempDir(), "boot-1", nil)
	put(t, cp, "a")
	put(t, cp, "b")
	got, err := cp.Lookup("a", "missing")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[types.UID]record{"a": {UID: "a", State: "completed"}}; !maps.Equal(got, want) {
		t.Errorf("Lookup(a, missing) = %v, want %v", got, want)
	}
}

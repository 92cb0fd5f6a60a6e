package checkpoint

import (
	"iter"

	"k8s.io/apimachinery/pkg/types"
)

// Records is what an update sees of the checkpoint: the records as they are,
// and the update's own changes, kept apart from them until the update
// succeeds. The checkpoint then knows which records changed, and encodes
// only those when it writes the file.
type Records[R any] struct {
	base    map[types.UID]R
	changes map[types.UID]change[R]
}

// change is one record set or deleted by an update.
type change[R any] struct {
	rec     R
	deleted bool
}

// Get returns uid's record, as this update left it.
func (r *Records[R]) Get(uid types.UID) (R, bool) {
	if ch, ok := r.changes[uid]; ok {
		return ch.rec, !ch.deleted
	}
	rec, ok := r.base[uid]
	return rec, ok
}

// Set records rec as uid's. Records are values: a record is replaced, never
// changed where it is.
func (r *Records[R]) Set(uid types.UID, rec R) {
	if r.changes == nil {
		r.changes = map[types.UID]change[R]{}
	}
	r.changes[uid] = change[R]{rec: rec}
}

// Delete removes uid's record, if there is one.
func (r *Records[R]) Delete(uid types.UID) {
	if r.changes == nil {
		r.changes = map[types.UID]change[R]{}
	}
	var zero R
	r.changes[uid] = change[R]{rec: zero, deleted: true}
}

// Len is how many records there are.
func (r *Records[R]) Len() int {
	n := len(r.base)
	for uid, ch := range r.changes {
		_, had := r.base[uid]
		switch {
		case had && ch.deleted:
			n--
		case !had && !ch.deleted:
			n++
		}
	}
	return n
}

// All yields every record, as this update left it, in no particular order.
func (r *Records[R]) All() iter.Seq2[types.UID, R] {
	return func(yield func(types.UID, R) bool) {
		for uid, rec := range r.base {
			if _, changed := r.changes[uid]; changed {
				continue
			}
			if !yield(uid, rec) {
				return
			}
		}
		for uid, ch := range r.changes {
			if !ch.deleted && !yield(uid, ch.rec) {
				return
			}
		}
	}
}

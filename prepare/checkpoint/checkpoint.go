// Package checkpoint keeps the agent's records of prepared claims in one
// crash-safe file: versioned, checksummed, written atomically under a flock,
// with concurrent updates committed in groups.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Version is the version of the checkpoint file's format. A file of
// an older version is kept aside, like a corrupt one; a newer one is refused.
const Version = 1

// ErrNewerVersion is returned for a checkpoint written by a newer carve. It
// is never kept aside like a corrupt one: starting empty would forget every
// prepared share, and the newer agent can still read it after a roll forward.
var ErrNewerVersion = errors.New("checkpoint written by a newer carve")

// checkpointData is the checksummed payload.
type checkpointData[R any] struct {
	BootID string          `json:"bootID"`
	Claims map[types.UID]R `json:"claims"`
}

// checkpointFile is what is on disk: a version, the payload and its
// checksum, so that a torn or edited file is detected.
type checkpointFile struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Checkpoint is the agent's record of prepared claims, one R per claim, in
// one file under the state directory. Every read-modify-write holds an exclusive flock on a lock
// file beside it, so that two agents sharing the directory during a rolling
// update never interleave.
type Checkpoint[R any] struct {
	path   string
	bootID string
	// onCorrupt is told about a checkpoint that could not be read and
	// was kept aside.
	onCorrupt func(kept string, err error)

	// Concurrent updates are committed in groups: one writer at a time
	// takes every update queued so far, applies them in order and writes
	// the file once, so that a hundred claims cost a few writes, not a
	// hundred.
	mu       sync.Mutex
	queue    []*pendingUpdate[R]
	flushing bool
	// fileMu orders this process's own readers and writers; the flock
	// orders them against other processes.
	fileMu sync.Mutex
	// cache is the last state read or written, with the file's identity
	// then; it spares re-parsing a file no other process has changed.
	cache    map[types.UID]R
	cacheKey fileKey
	// enc holds each cached record's encoding as last written (its key
	// and value, `"uid":{...}`): a write encodes only the records that
	// changed since, so that one claim's update does not cost the
	// encoding of every claim held. It is emptied with the cache.
	enc map[types.UID][]byte
	// buf is the file's bytes at the last write, reused by the next.
	buf []byte
	// onWrite, when set, is told each write's size and duration (the
	// agent's metrics): the file holds every claim, so both grow with
	// the claims held.
	onWrite func(size int, d time.Duration)
}

type pendingUpdate[R any] struct {
	fn   func(*Records[R]) error
	done chan error
	// lead hands this caller the writing of the next group.
	lead chan struct{}
}

// fileKey identifies one version of the file: a rename-over changes the
// inode, a rewrite in place changes size or time.
type fileKey struct {
	ino, size, mtime int64
}

// Path is the file of the checkpoint in dir.
func Path(dir string) string { return filepath.Join(dir, "checkpoint.json") }

// Open prepares the checkpoint in dir. bootID is the current boot's
// id: records from another boot describe kernel state that no longer exists
// and are dropped on first use.
func Open[R any](dir, bootID string, onCorrupt func(kept string, err error)) (*Checkpoint[R], error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	if onCorrupt == nil {
		onCorrupt = func(string, error) {}
	}
	return &Checkpoint[R]{path: Path(dir), bootID: bootID, onCorrupt: onCorrupt}, nil
}

// OnWrite has fn told the size in bytes and the duration of each write that
// succeeds, encoding included. Set it before the first Update.
func (c *Checkpoint[R]) OnWrite(fn func(size int, d time.Duration)) { c.onWrite = fn }

// Path is the checkpoint file's path.
func (c *Checkpoint[R]) Path() string { return c.path }

// Update runs fn on the current records under the lock and writes the result
// atomically if fn returns nil. A failing fn changes nothing: its changes
// are kept apart from the records until it returns. Updates from
// concurrent callers may be written together; each caller returns once its
// own change is on disk. The caller that writes a group returns after it,
// handing the next group to its first waiter: no caller keeps writing
// other callers' changes after its own is done.
func (c *Checkpoint[R]) Update(fn func(claims *Records[R]) error) error {
	p := &pendingUpdate[R]{fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if !c.flushing {
		c.flushing = true
		p.lead <- struct{}{}
	}
	c.mu.Unlock()
	for {
		select {
		case err := <-p.done:
			return err
		case <-p.lead:
			c.flushGroup()
		}
	}
}

// Queued is how many updates wait for the group being written (for tests
// and metrics).
func (c *Checkpoint[R]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// flushGroup commits every update queued so far, then hands the writing to
// the first update queued since, if any.
func (c *Checkpoint[R]) flushGroup() {
	c.mu.Lock()
	batch := c.queue
	c.queue = nil
	c.mu.Unlock()
	errs := c.commit(batch)
	for i, p := range batch {
		p.done <- errs[i]
	}
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.flushing = false
	} else {
		c.queue[0].lead <- struct{}{}
	}
	c.mu.Unlock()
}

func (c *Checkpoint[R]) commit(batch []*pendingUpdate[R]) []error {
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	unlock, err := c.lock()
	if err != nil {
		return fail(err)
	}
	defer unlock()
	claims, err := c.load()
	if err != nil {
		return fail(err)
	}
	for i, p := range batch {
		// Each update's changes are applied only if it succeeds, so
		// that one that fails leaves no trace.
		r := &Records[R]{base: claims}
		if errs[i] = p.fn(r); errs[i] != nil {
			continue
		}
		for uid, ch := range r.changes {
			if ch.deleted {
				delete(claims, uid)
			} else {
				claims[uid] = ch.rec
			}
			delete(c.enc, uid)
		}
	}
	if err := c.write(claims); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	return errs
}

// Read returns the current records.
func (c *Checkpoint[R]) Read() (map[types.UID]R, error) {
	unlock, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	claims, err := c.load()
	if err != nil {
		return nil, err
	}
	return maps.Clone(claims), nil
}

// Lookup returns the records of uids that exist: what a prepare or an
// unprepare needs, without copying every record held.
func (c *Checkpoint[R]) Lookup(uids ...types.UID) (map[types.UID]R, error) {
	unlock, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	claims, err := c.load()
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]R, len(uids))
	for _, uid := range uids {
		if rec, ok := claims[uid]; ok {
			out[uid] = rec
		}
	}
	return out, nil
}

func (c *Checkpoint[R]) lock() (func(), error) {
	c.fileMu.Lock()
	f, err := os.OpenFile(c.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		c.fileMu.Unlock()
		return nil, fmt.Errorf("open checkpoint lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		c.fileMu.Unlock()
		return nil, fmt.Errorf("lock checkpoint: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close() // a lock file: nothing is written to it
		c.fileMu.Unlock()
	}, nil
}

// load returns the current records: the cache itself, which only commit
// changes, re-read from the file when another process replaced it. A
// missing file is empty; a corrupt one, or one of an older version, is
// renamed aside and reported, and reading goes on from empty, so that a bad
// file never crash-loops the agent. The caller holds the lock.
func (c *Checkpoint[R]) load() (map[types.UID]R, error) {
	key, err := statKey(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return c.setCache(map[types.UID]R{}, fileKey{}), nil
	}
	if err == nil && c.cache != nil && key == c.cacheKey {
		return c.cache, nil
	}
	raw, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return c.setCache(map[types.UID]R{}, fileKey{}), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	data, err := decodeCheckpoint[R](raw)
	if errors.Is(err, ErrNewerVersion) {
		return nil, fmt.Errorf("checkpoint %s: %w", c.path, err)
	}
	if err != nil {
		kept := fmt.Sprintf("%s.corrupt-%s", c.path, time.Now().UTC().Format("20060102T150405.000000000"))
		if rerr := os.Rename(c.path, kept); rerr != nil {
			return nil, fmt.Errorf("checkpoint %s is unreadable (%v) and could not be kept aside: %w", c.path, err, rerr)
		}
		c.onCorrupt(kept, err)
		return c.setCache(map[types.UID]R{}, fileKey{}), nil
	}
	if data.BootID != c.bootID {
		// After a reboot nothing the records describe exists: the
		// interfaces, pins and CDI specs under /run are gone.
		return c.setCache(map[types.UID]R{}, key), nil
	}
	return c.setCache(data.Claims, key), nil
}

// setCache makes claims the cache, as the file whose identity is key holds
// it (the zero key: no file), with nothing of it encoded yet.
func (c *Checkpoint[R]) setCache(claims map[types.UID]R, key fileKey) map[types.UID]R {
	c.cache, c.cacheKey, c.enc = claims, key, map[types.UID][]byte{}
	return claims
}

func statKey(path string) (fileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileKey{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim.Nano()}, nil
}

func decodeCheckpoint[R any](raw []byte) (checkpointData[R], error) {
	var f checkpointFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return checkpointData[R]{}, fmt.Errorf("not a checkpoint: %w", err)
	}
	if f.Version > Version {
		return checkpointData[R]{}, fmt.Errorf("%w: version %d, this agent reads version %d; run the newer carve again, or unprepare its claims first", ErrNewerVersion, f.Version, Version)
	}
	if f.Version != Version {
		return checkpointData[R]{}, fmt.Errorf("checkpoint version %d, this agent reads version %d", f.Version, Version)
	}
	if sum := checksum(f.Data); sum != f.Checksum {
		return checkpointData[R]{}, fmt.Errorf("checksum mismatch: file says %s, data is %s", f.Checksum, sum)
	}
	var data checkpointData[R]
	if err := json.Unmarshal(f.Data, &data); err != nil {
		return checkpointData[R]{}, fmt.Errorf("checkpoint data: %w", err)
	}
	if data.Claims == nil {
		data.Claims = map[types.UID]R{}
	}
	return data, nil
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fileHead is what the file holds before its payload; the checksum's hex
// digits go at checksumAt. The file is assembled by hand, not by
// json.Marshal, which would validate and compact the whole payload again.
var (
	fileHead   = checksumHead + zeroSum + `","data":`
	checksumAt = len(checksumHead)
)

const zeroSum = "0000000000000000000000000000000000000000000000000000000000000000"

var checksumHead = `{"version":` + strconv.Itoa(Version) + `,"checksum":"sha256:`

// write replaces the file atomically with claims: temp file, rename. Only the records not encoded since they last
// changed are encoded; the others' bytes are copied. On failure the cache
// is dropped: claims, changed already, may not be what the file holds.
func (c *Checkpoint[R]) write(claims map[types.UID]R) error {
	start := time.Now()
	if c.enc == nil {
		c.enc = map[types.UID][]byte{}
	}
	out := append(c.buf[:0], fileHead...)
	payload := len(out)
	out = append(out, `{"bootID":`...)
	out, err := appendJSON(out, c.bootID)
	if err != nil {
		c.setCache(nil, fileKey{})
		return err
	}
	out = append(out, `,"claims":{`...)
	first := true
	for uid, rec := range claims {
		e, ok := c.enc[uid]
		if !ok {
			if e, err = appendJSON(nil, string(uid)); err == nil {
				e = append(e, ':')
				e, err = appendJSON(e, rec)
			}
			if err != nil {
				c.setCache(nil, fileKey{})
				return fmt.Errorf("claim %s: %w", uid, err)
			}
			c.enc[uid] = e
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, e...)
	}
	out = append(out, "}}"...)
	sum := sha256.Sum256(out[payload:])
	hex.Encode(out[checksumAt:checksumAt+len(zeroSum)], sum[:])
	out = append(out, '}')
	c.buf = out
	// Replace, not Write: the records are of this boot only (records of
	// another boot are dropped as the file is read), so an fsync would
	// keep across a power cut only what the next boot drops. A crash of
	// the process finds the old file or the new; a power cut may leave
	// it empty, which is read as corrupt and kept aside, and loses
	// nothing of the new boot. The two fsyncs a write cost 40-60% of a
	// prepare's time under concurrent claims (issue 44).
	if err := atomicfile.Replace(c.path, out, 0o600); err != nil {
		c.setCache(nil, fileKey{})
		return err
	}
	if c.onWrite != nil {
		c.onWrite(len(out), time.Since(start))
	}
	key, err := statKey(c.path)
	if err != nil {
		c.setCache(nil, fileKey{})
		return nil
	}
	c.cache, c.cacheKey = claims, key
	return nil
}

// appendJSON appends v's JSON encoding, as json.Marshal gives it, to b.
func appendJSON(b []byte, v any) ([]byte, error) {
	e, err := json.Marshal(v)
	if err != nil {
		return b, fmt.Errorf("encode checkpoint: %w", err)
	}
	return append(b, e...), nil
}

// ReadBootID reads the running kernel's boot id. The boot id belongs to the
// kernel this process runs on, so it is read from the agent's own /proc; a
// root's copy is used only where it exists (a host root mounted at /host
// shows the same kernel), so that a fixture root without procfs works.
func ReadBootID(root string) (string, error) {
	const rel = "proc/sys/kernel/random/boot_id"
	path := filepath.Join("/", rel)
	if root != "" && root != "/" {
		if _, err := os.Stat(filepath.Join(root, rel)); err == nil {
			path = filepath.Join(root, rel)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot id: %s is empty", path)
	}
	return id, nil
}

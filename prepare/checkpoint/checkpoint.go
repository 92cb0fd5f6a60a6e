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
	// the file once, so that a hundred claims cost a few fsyncs, not a
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
}

type pendingUpdate[R any] struct {
	fn   func(map[types.UID]R) error
	done chan error
	// lead hands this caller the writing of the next group.
	lead chan struct{}
}

// fileKey identifies one version of the file: a rename-over changes the
// inode, a rewrite in place changes size or time.
type fileKey struct {
	ino, size, mtime int64
}

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
	return &Checkpoint[R]{path: filepath.Join(dir, "checkpoint.json"), bootID: bootID, onCorrupt: onCorrupt}, nil
}

// Path is the checkpoint file's path.
func (c *Checkpoint[R]) Path() string { return c.path }

// Update runs fn on the current records under the lock and writes the result
// atomically if fn returns nil. A failing fn changes nothing. Updates from
// concurrent callers may be written together; each caller returns once its
// own change is on disk. The caller that writes a group returns after it,
// handing the next group to its first waiter: no caller keeps writing
// other callers' changes after its own is done.
func (c *Checkpoint[R]) Update(fn func(claims map[types.UID]R) error) error {
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
	claims, err := c.read()
	if err != nil {
		return fail(err)
	}
	for i, p := range batch {
		// Each update works on a copy, so that one that fails leaves
		// no trace; records are values, replaced rather than changed.
		next := maps.Clone(claims)
		if errs[i] = p.fn(next); errs[i] == nil {
			claims = next
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
	return c.read()
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

// read loads the records. A missing file is empty; a corrupt one, or one of
// an older version, is renamed aside and reported, and reading goes on from
// empty, so that a bad file never crash-loops the agent.
func (c *Checkpoint[R]) read() (map[types.UID]R, error) {
	key, err := statKey(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]R{}, nil
	}
	if err == nil && c.cache != nil && key == c.cacheKey {
		return maps.Clone(c.cache), nil
	}
	raw, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]R{}, nil
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
		return map[types.UID]R{}, nil
	}
	if data.BootID != c.bootID {
		// After a reboot nothing the records describe exists: the
		// interfaces, pins and CDI specs under /run are gone.
		return map[types.UID]R{}, nil
	}
	c.cache, c.cacheKey = maps.Clone(data.Claims), key
	return data.Claims, nil
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

// write replaces the file atomically: temp file, fsync, rename, fsync of the
// directory.
func (c *Checkpoint[R]) write(claims map[types.UID]R) error {
	data, err := json.Marshal(checkpointData[R]{BootID: c.bootID, Claims: claims})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	out, err := json.Marshal(checkpointFile{Version: Version, Checksum: checksum(data), Data: data})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if err := atomicfile.Write(c.path, out, 0o600); err != nil {
		c.cache = nil
		return err
	}
	if key, err := statKey(c.path); err == nil {
		c.cache, c.cacheKey = maps.Clone(claims), key
	} else {
		c.cache = nil
	}
	return nil
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

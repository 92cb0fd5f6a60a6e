package prepare

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

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// CheckpointVersion is the version of the checkpoint file's format. A file of
// another version is not read: it is kept aside, like a corrupt one.
const CheckpointVersion = 1

// ClaimState is the phase a claim's preparation reached.
type ClaimState string

const (
	// ClaimStarted is written before any preparer runs. A claim found in
	// this state after a crash is rolled back and prepared again.
	ClaimStarted ClaimState = "started"
	// ClaimCompleted is written once every device is prepared and the CDI
	// spec is on disk.
	ClaimCompleted ClaimState = "completed"
)

// ClaimRecord is everything needed to answer a repeated prepare and to undo
// a claim, whichever process prepared it.
type ClaimRecord struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	// Allocations are this driver's devices of the claim; with the
	// deterministic naming of preparers they are enough to undo a
	// claim whose preparation never completed.
	Allocations []Allocation `json:"allocations"`
	// Undo holds each preparer's undo record, by allocation index, once
	// completed.
	Undo []json.RawMessage `json:"undo,omitempty"`
	// Devices is the result returned to the kubelet.
	Devices []PreparedDevice `json:"devices,omitempty"`
	// CDISpec is the name of the claim's CDI spec file.
	CDISpec string `json:"cdiSpec,omitempty"`
	// Updated is when the record was last written.
	Updated time.Time `json:"updated"`
}

// PreparedDevice is one device's answer to the kubelet.
type PreparedDevice struct {
	Request      string     `json:"request"`
	Pool         string     `json:"pool"`
	Device       string     `json:"device"`
	ShareID      *types.UID `json:"shareID,omitempty"`
	CDIDeviceIDs []string   `json:"cdiDeviceIDs"`
	// Network is the network data reported in the claim's status.
	Network *resourceapi.NetworkDeviceData `json:"network,omitempty"`
}

// checkpointData is the checksummed payload.
type checkpointData struct {
	BootID string                    `json:"bootID"`
	Claims map[types.UID]ClaimRecord `json:"claims"`
}

// checkpointFile is what is on disk: a version, the payload and its
// checksum, so that a torn or edited file is detected.
type checkpointFile struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Checkpoint is the agent's record of prepared claims, in one file under the
// state directory. Every read-modify-write holds an exclusive flock on a lock
// file beside it, so that two agents sharing the directory during a rolling
// update never interleave.
type Checkpoint struct {
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
	queue    []*pendingUpdate
	flushing bool
	// fileMu orders this process's own readers and writers; the flock
	// orders them against other processes.
	fileMu sync.Mutex
	// cache is the last state read or written, with the file's identity
	// then; it spares re-parsing a file no other process has changed.
	cache    map[types.UID]ClaimRecord
	cacheKey fileKey
}

type pendingUpdate struct {
	fn   func(map[types.UID]ClaimRecord) error
	done chan error
}

// fileKey identifies one version of the file: a rename-over changes the
// inode, a rewrite in place changes size or time.
type fileKey struct {
	ino, size, mtime int64
}

// OpenCheckpoint prepares the checkpoint in dir. bootID is the current boot's
// id: records from another boot describe kernel state that no longer exists
// and are dropped on first use.
func OpenCheckpoint(dir, bootID string, onCorrupt func(kept string, err error)) (*Checkpoint, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	if onCorrupt == nil {
		onCorrupt = func(string, error) {}
	}
	return &Checkpoint{path: filepath.Join(dir, "checkpoint.json"), bootID: bootID, onCorrupt: onCorrupt}, nil
}

// Path is the checkpoint file's path.
func (c *Checkpoint) Path() string { return c.path }

// Update runs fn on the current records under the lock and writes the result
// atomically if fn returns nil. A failing fn changes nothing. Updates from
// concurrent callers may be written together; each caller returns once its
// own change is on disk.
func (c *Checkpoint) Update(fn func(claims map[types.UID]ClaimRecord) error) error {
	p := &pendingUpdate{fn: fn, done: make(chan error, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	leader := !c.flushing
	c.flushing = true
	c.mu.Unlock()
	if leader {
		c.flush()
	}
	return <-p.done
}

// flush commits queued updates, group by group, until the queue is empty.
func (c *Checkpoint) flush() {
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		if len(batch) == 0 {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		errs := c.commit(batch)
		for i, p := range batch {
			p.done <- errs[i]
		}
	}
}

func (c *Checkpoint) commit(batch []*pendingUpdate) []error {
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
func (c *Checkpoint) Read() (map[types.UID]ClaimRecord, error) {
	unlock, err := c.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return c.read()
}

func (c *Checkpoint) lock() (func(), error) {
	c.fileMu.Lock()
	f, err := os.OpenFile(c.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		c.fileMu.Unlock()
		return nil, fmt.Errorf("open checkpoint lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		c.fileMu.Unlock()
		return nil, fmt.Errorf("lock checkpoint: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		c.fileMu.Unlock()
	}, nil
}

// read loads the records. A missing file is empty; a corrupt one, or one of
// another version, is renamed aside and reported, and reading goes on from
// empty, so that a bad file never crash-loops the agent.
func (c *Checkpoint) read() (map[types.UID]ClaimRecord, error) {
	key, err := statKey(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]ClaimRecord{}, nil
	}
	if err == nil && c.cache != nil && key == c.cacheKey {
		return maps.Clone(c.cache), nil
	}
	raw, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]ClaimRecord{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	data, err := decodeCheckpoint(raw)
	if err != nil {
		kept := fmt.Sprintf("%s.corrupt-%s", c.path, time.Now().UTC().Format("20060102T150405.000000000"))
		if rerr := os.Rename(c.path, kept); rerr != nil {
			return nil, fmt.Errorf("checkpoint %s is unreadable (%v) and could not be kept aside: %w", c.path, err, rerr)
		}
		c.onCorrupt(kept, err)
		return map[types.UID]ClaimRecord{}, nil
	}
	if data.BootID != c.bootID {
		// After a reboot nothing the records describe exists: the
		// interfaces, pins and CDI specs under /run are gone.
		return map[types.UID]ClaimRecord{}, nil
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

func decodeCheckpoint(raw []byte) (checkpointData, error) {
	var f checkpointFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return checkpointData{}, fmt.Errorf("not a checkpoint: %w", err)
	}
	if f.Version != CheckpointVersion {
		return checkpointData{}, fmt.Errorf("checkpoint version %d, this agent reads version %d", f.Version, CheckpointVersion)
	}
	if sum := checksum(f.Data); sum != f.Checksum {
		return checkpointData{}, fmt.Errorf("checksum mismatch: file says %s, data is %s", f.Checksum, sum)
	}
	var data checkpointData
	if err := json.Unmarshal(f.Data, &data); err != nil {
		return checkpointData{}, fmt.Errorf("checkpoint data: %w", err)
	}
	if data.Claims == nil {
		data.Claims = map[types.UID]ClaimRecord{}
	}
	return data, nil
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// write replaces the file atomically: temp file, fsync, rename, fsync of the
// directory.
func (c *Checkpoint) write(claims map[types.UID]ClaimRecord) error {
	data, err := json.Marshal(checkpointData{BootID: c.bootID, Claims: claims})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	out, err := json.Marshal(checkpointFile{Version: CheckpointVersion, Checksum: checksum(data), Data: data})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if err := WriteFileAtomic(c.path, out, 0o600); err != nil {
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

// WriteFileAtomic writes a file so that a crash leaves either the old or the
// new content, never a torn one.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
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

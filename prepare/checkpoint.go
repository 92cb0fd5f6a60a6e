package prepare

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

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
// atomically if fn returns nil.
func (c *Checkpoint) Update(fn func(claims map[types.UID]ClaimRecord) error) error {
	unlock, err := c.lock()
	if err != nil {
		return err
	}
	defer unlock()
	claims, err := c.read()
	if err != nil {
		return err
	}
	if err := fn(claims); err != nil {
		return err
	}
	return c.write(claims)
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
	f, err := os.OpenFile(c.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock checkpoint: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// read loads the records. A missing file is empty; a corrupt one, or one of
// another version, is renamed aside and reported, and reading goes on from
// empty, so that a bad file never crash-loops the agent.
func (c *Checkpoint) read() (map[types.UID]ClaimRecord, error) {
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
	return data.Claims, nil
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
	return WriteFileAtomic(c.path, out, 0o600)
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

// ReadBootID reads the kernel's boot id under root.
func ReadBootID(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/sys/kernel/random/boot_id"))
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

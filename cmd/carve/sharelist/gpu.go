package sharelist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/prepare/checkpoint"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices/names"
)

// GPU is a GPU memory share's own part of its row.
type GPU struct {
	UUID string `json:"uuid"`
	// Tier is the GPU's memoryEnforcement: dmem or mps-policed.
	Tier       string `json:"tier"`
	SliceBytes uint64 `json:"sliceBytes"`
	// UsedBytes is what the share's pods hold, read from UsedFrom (nvml:
	// now; agent: the policing loop's last reading; dmem.current: the
	// kernel's count); null where it is not known here, UsedUnknown
	// saying why.
	UsedBytes   *uint64 `json:"usedBytes"`
	UsedFrom    string  `json:"usedFrom,omitempty"`
	UsedUnknown string  `json:"usedUnknown,omitempty"`
	Processes   int     `json:"processes"`
	// Kills are the share's processes the policing loop killed so far.
	Kills uint64 `json:"kills"`
	// MPSDaemon is the state of the claim's own MPS control daemon of the
	// GPU (mps-policed shares); its not running is also a problem.
	MPSDaemon *memslice.Daemon `json:"mpsDaemon,omitempty"`
	// Adopted: recorded on the node, not in the checkpoint (lost or
	// corrupt); the agent adopted it and holds it until its claim's
	// unprepare.
	Adopted bool `json:"adopted,omitempty"`
}

// GPUSource lists GPU memory shares (gpu/memslice) from the checkpoint in
// StateDir and checks them against the node below Root ("/"): the MPS
// daemons, the dmem limits of the pods' cgroups.
type GPUSource struct {
	StateDir string
	Root     string
	// NVML opens the node's NVML to measure mps-policed shares' use now;
	// its error says why there is none (used is then the agent's last
	// reading). It is called only where such a share is listed. Nil: no
	// NVML.
	NVML func(ctx context.Context) (police.Processes, func(), error)
}

// Shares implements Source.
func (s *GPUSource) Shares(ctx context.Context) ([]Row, error) {
	root := s.Root
	if root == "" {
		root = "/"
	}
	if _, err := os.Stat(s.StateDir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	bootID, err := checkpoint.ReadBootID(root)
	if err != nil {
		return nil, err
	}
	opts := memslice.ListOptions{StateDir: s.StateDir, BootID: bootID, ProcRoot: filepath.Join(root, "proc"),
		CgroupRoot: filepath.Join(root, hook.DefaultCgroupRoot)}
	shares, err := memslice.ListShares(ctx, opts)
	if err != nil {
		return nil, err
	}
	if s.NVML != nil && anyPoliced(shares) {
		live, closeNVML, err := s.NVML(ctx)
		if err != nil {
			opts.LiveUnknown = err.Error()
		} else {
			defer closeNVML()
			opts.Live = live
		}
		if shares, err = memslice.ListShares(ctx, opts); err != nil {
			return nil, err
		}
	}
	rows := []Row{}
	for _, sh := range shares {
		rows = append(rows, Row{Claim: sh.Claim, ClaimUID: sh.ClaimUID, Kind: names.KindGPU, Device: sh.Device, ShareID: sh.ShareID,
			Parent: sh.UUID, Enforced: sh.Enforced, Problems: sh.Problems,
			GPU: &GPU{UUID: sh.UUID, Tier: string(sh.Tier), SliceBytes: sh.Slice, UsedBytes: sh.Used, UsedFrom: sh.UsedFrom,
				UsedUnknown: sh.UsedUnknown, Processes: sh.Processes, Kills: sh.Kills, MPSDaemon: sh.Daemon, Adopted: sh.Adopted}})
	}
	return rows, nil
}

func anyPoliced(shares []memslice.Share) bool {
	for _, s := range shares {
		if s.Tier == memslice.TierMPSPoliced {
			return true
		}
	}
	return false
}

// used is a GPU row's USED column: the bytes and where they were read, or
// why they are unknown.
func (g *GPU) used() string {
	if g.UsedBytes == nil {
		return "unknown: " + g.UsedUnknown
	}
	return iec(*g.UsedBytes) + " (" + g.UsedFrom + ")"
}

// iec formats bytes as 10Gi or 1.5Gi; "0" for none.
func iec(v uint64) string {
	for _, u := range []struct {
		shift uint
		unit  string
	}{{40, "Ti"}, {30, "Gi"}, {20, "Mi"}, {10, "Ki"}} {
		if v >= 1<<u.shift {
			return strconv.FormatFloat(float64(v)/float64(uint64(1)<<u.shift), 'f', -1, 64) + u.unit
		}
	}
	return fmt.Sprint(v)
}

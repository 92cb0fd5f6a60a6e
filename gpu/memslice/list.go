package memslice

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/dmem"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices/names"
)

// SharesDir is the manager's Dir below the agent's state directory.
const SharesDir = "gpushare"

// UsageFile is the policing loop's state file below the state directory.
const UsageFile = SharesDir + "/usage.json"

// Where a share's used memory was read.
const (
	// UsedFromNVML: measured now, NVML's processes of the share's pods.
	UsedFromNVML = "nvml"
	// UsedFromAgent: the policing loop's last reading (NVML's, every
	// 50 ms while the agent runs).
	UsedFromAgent = "agent"
	// UsedFromDmem: the kernel's count, dmem.current of the share's pods.
	UsedFromDmem = "dmem.current"
)

// Share is one GPU share as `carve shares` lists it.
type Share struct {
	Claim    string `json:"claim"`
	ClaimUID string `json:"claimUID"`
	ShareID  string `json:"shareID"`
	// Device is the published device the share is of.
	Device string `json:"device"`
	UUID   string `json:"gpuUUID"`
	Slice  uint64 `json:"sliceBytes"`
	// Used is what the share's pods hold of the GPU, read from UsedFrom;
	// nil where it cannot be known here, UsedUnknown saying why.
	Used        *uint64 `json:"usedBytes"`
	UsedFrom    string  `json:"usedFrom,omitempty"`
	UsedUnknown string  `json:"usedUnknown,omitempty"`
	Processes   int     `json:"processes"`
	Tier        Tier    `json:"tier"`
	Kills       uint64  `json:"kills"`
	// Enforced is true where what holds the share to its slice is in
	// place: the GPU's MPS daemon running (mps-policed), the slice in
	// dmem.max of every pod it was written to that still runs (dmem).
	// Problems says what is missing where not.
	Enforced bool     `json:"enforced"`
	Problems []string `json:"problems,omitempty"`
	// Daemon is the state of the claim's MPS control daemon of the GPU
	// (mps-policed shares).
	Daemon *Daemon `json:"mpsDaemon,omitempty"`
	// Adopted: recorded on the node but not in the checkpoint (lost or
	// corrupt), so adopted by the agent at its start and held until the
	// claim's unprepare. Device is then unknown.
	Adopted bool `json:"adopted,omitempty"`
}

// Daemon is a claim's MPS control daemon of a GPU as `carve shares` lists
// it.
type Daemon struct {
	PipeDir string `json:"pipeDir"`
	// PID is the daemon's, from its pid file; 0 where there is none.
	PID     int  `json:"pid,omitempty"`
	Running bool `json:"running"`
}

// ListOptions say where the shares are read from.
type ListOptions struct {
	// StateDir is the agent's --state-dir; BootID the node's boot id
	// (checkpoint.ReadBootID), without which the checkpoint reads empty.
	StateDir string
	BootID   string
	// Live, when set, measures each mps-policed share's used memory now
	// from NVML (its pods' processes, found through ProcRoot); without it,
	// used is what the policing loop last recorded, where it did.
	Live police.Processes
	// LiveUnknown says why Live is nil (no NVML here), for UsedUnknown.
	LiveUnknown string
	// ProcRoot is the host's /proc (the MPS daemons' and the GPU
	// processes' PIDs); /proc when empty.
	ProcRoot string
	// CgroupRoot is the host's cgroup v2 mount (dmem shares' pods);
	// hook.DefaultCgroupRoot when empty.
	CgroupRoot string
}

// ListShares lists every prepared GPU memory share of the node, from the
// checkpoint, with its used memory, kills so far and whether it is
// enforced.
func ListShares(ctx context.Context, o ListOptions) ([]Share, error) {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.CgroupRoot == "" {
		o.CgroupRoot = hook.DefaultCgroupRoot
	}
	cp, err := prepare.OpenCheckpoint(o.StateDir, o.BootID, nil)
	if err != nil {
		return nil, err
	}
	claims, err := cp.Read()
	if err != nil {
		return nil, err
	}
	usage, err := police.ReadUsage(filepath.Join(o.StateDir, UsageFile))
	if err != nil {
		return nil, err
	}
	out := []Share{}
	seen := map[int]police.ShareUsage{} // by index in out: what the policing loop recorded
	inCheckpoint := map[string]bool{}   // share keys
	for _, c := range claims {
		for i, a := range c.Allocations {
			if a.Kind != names.KindGPU || a.ShareID == nil {
				continue
			}
			if c.State != prepare.ClaimCompleted || i >= len(c.Undo) || len(c.Undo[i]) == 0 {
				// Being prepared, or left half prepared by a crash: what
				// holds it may not be in place.
				out = append(out, Share{Claim: c.Namespace + "/" + c.Name, ClaimUID: string(c.UID), ShareID: string(*a.ShareID), Device: a.Device,
					UsedUnknown: "preparation not completed", Problems: []string{"preparation not completed"}})
				continue
			}
			var rec Record
			if err := json.Unmarshal(c.Undo[i], &rec); err != nil {
				return nil, fmt.Errorf("claim %s/%s: GPU share record: %w", c.Namespace, c.Name, err)
			}
			s := Share{Claim: c.Namespace + "/" + c.Name, ClaimUID: string(c.UID), ShareID: string(*a.ShareID), Device: a.Device,
				UUID: rec.UUID, Slice: rec.Slice, Tier: rec.Tier}
			inCheckpoint[a.ShareKey()] = true
			if err := check(&s, o, a.ShareKey(), rec.Region, usage, seen, len(out)); err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	// Shares recorded on the node that the checkpoint does not hold (it
	// was lost or corrupt): the agent adopted them and holds them until
	// their claims' unprepare, so they are listed too.
	onNode, err := (&Manager{opts: Options{Dir: filepath.Join(o.StateDir, SharesDir)}}).daemonsOnNode()
	if err != nil {
		return nil, err
	}
	for _, d := range onNode {
		for _, r := range d.shares {
			if inCheckpoint[r.Key] {
				continue
			}
			inCheckpoint[r.Key] = true
			s := Share{Claim: r.Namespace + "/" + r.Name, ClaimUID: string(r.ClaimUID), ShareID: r.ShareID, UUID: r.UUID, Slice: r.Slice,
				Tier: r.Choice.Tier, Adopted: true}
			if err := check(&s, o, r.Key, r.Choice.Region, usage, seen, len(out)); err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	if err := used(ctx, o, out, seen); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UUID != out[j].UUID {
			return out[i].UUID < out[j].UUID
		}
		return out[i].Claim+out[i].ShareID < out[j].Claim+out[j].ShareID
	})
	return out, nil
}

// check fills in whether s (the share with key, its dmem region where it
// has one, at index i of the list) is enforced: its daemon, or the slice in
// its pods' dmem.max; the policing loop's kills.
func check(s *Share, o ListOptions, key, region string, usage map[string]police.ShareUsage, seen map[int]police.ShareUsage, i int) error {
	switch s.Tier {
	case TierMPSPoliced:
		if u, ok := usage[key]; ok {
			s.Kills, seen[i] = u.Kills, u
		}
		checkDaemon(s, o)
	case TierDMEM:
		cgroups, err := hook.RecordedPodCgroups(RecordDir(filepath.Join(o.StateDir, SharesDir), s.UUID, key), o.CgroupRoot)
		if err != nil {
			return fmt.Errorf("claim %s: GPU share %s: %w", s.Claim, s.ShareID, err)
		}
		used, problems := dmem.Held(cgroups, region, s.Slice)
		s.Used, s.UsedFrom, s.Problems = &used, UsedFromDmem, problems
	default:
		s.Problems = append(s.Problems, fmt.Sprintf("tier %q holds no slice", s.Tier))
	}
	s.Enforced = len(s.Problems) == 0
	return nil
}

// checkDaemon: an mps-policed share is held only while its claim's control
// daemon of the GPU runs (its ceiling, its clients' only way in).
func checkDaemon(s *Share, o ListOptions) {
	d := mps.Daemon{Dir: DaemonDir(filepath.Join(o.StateDir, SharesDir), types.UID(s.ClaimUID), s.UUID), UUID: s.UUID, ProcRoot: o.ProcRoot}
	pid, alive := d.PID()
	s.Daemon = &Daemon{PipeDir: d.PipeDir(), PID: pid, Running: alive}
	if !alive {
		s.Daemon.PID = 0
		s.Problems = append(s.Problems, fmt.Sprintf("the MPS control daemon of %s is not running (claim %s's own; pipe %s)", s.UUID, s.Claim, d.PipeDir()))
	}
}

// used fills in the mps-policed shares' used memory: measured now from NVML
// where Live is given and the share's pods are known, else the policing
// loop's last reading, else unknown with the reason.
func used(ctx context.Context, o ListOptions, out []Share, seen map[int]police.ShareUsage) error {
	byGPU := map[string][]int{}
	for i := range out {
		if out[i].Tier != TierMPSPoliced {
			continue
		}
		u, ok := seen[i]
		switch {
		case !ok:
			out[i].UsedUnknown = "no reading by the agent yet"
			if o.Live == nil && o.LiveUnknown != "" {
				out[i].UsedUnknown += "; no NVML here: " + o.LiveUnknown
			}
		case o.Live != nil:
			byGPU[out[i].UUID] = append(byGPU[out[i].UUID], i)
		default:
			v := u.UsedBytes
			out[i].Used, out[i].UsedFrom, out[i].Processes = &v, UsedFromAgent, u.Processes
		}
	}
	for uuid, idx := range byGPU {
		procs, err := o.Live.Processes(ctx, uuid)
		if err != nil {
			return fmt.Errorf("GPU %s: %w", uuid, err)
		}
		for _, i := range idx {
			var v uint64
			n := 0
			for _, p := range procs {
				pod, err := police.PodOf(o.ProcRoot, int(p.PID))
				if err == nil && slices.Contains(seen[i].Pods, pod) {
					if !p.UsedUnknown && p.UsedBytes != gpu.NotAvailable {
						v += p.UsedBytes // "not available" is no number
					}
					n++
				}
			}
			out[i].Used, out[i].UsedFrom, out[i].Processes = &v, UsedFromNVML, n
		}
	}
	return nil
}

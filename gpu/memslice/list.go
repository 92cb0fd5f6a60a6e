package memslice

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"

	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/prepare"
	kinds "github.com/carve-dra/carve/slices"
)

// UsageFile is the policing loop's state file below the state directory.
const UsageFile = "gpushare/usage.json"

// Share is one GPU share as `carve shares` lists it.
type Share struct {
	Claim     string `json:"claim"`
	ClaimUID  string `json:"claimUID"`
	ShareID   string `json:"shareID"`
	UUID      string `json:"gpuUUID"`
	Slice     uint64 `json:"sliceBytes"`
	Used      uint64 `json:"usedBytes"`
	Processes int    `json:"processes"`
	Tier      Tier   `json:"tier"`
	Kills     uint64 `json:"kills"`
}

// ListOptions say where the shares are read from.
type ListOptions struct {
	// StateDir is the agent's --state-dir; BootID the node's boot id
	// (checkpoint.ReadBootID), without which the checkpoint reads empty.
	StateDir string
	BootID   string
	// Live, when set, measures each share's used memory now from NVML
	// (its pods' processes, found through ProcRoot); without it, used is
	// what the policing loop last recorded.
	Live     police.Processes
	ProcRoot string
}

// ListShares lists every prepared GPU memory share of the node, from the
// checkpoint, with its used memory and kills so far.
func ListShares(ctx context.Context, o ListOptions) ([]Share, error) {
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
	var out []Share
	live := map[string][]police.ShareUsage{}
	for _, c := range claims {
		if c.State != prepare.ClaimCompleted {
			continue
		}
		for i, a := range c.Allocations {
			if a.Kind != kinds.KindGPU || a.ShareID == nil || i >= len(c.Undo) {
				continue
			}
			var rec Record
			if err := json.Unmarshal(c.Undo[i], &rec); err != nil {
				return nil, fmt.Errorf("claim %s/%s: GPU share record: %w", c.Namespace, c.Name, err)
			}
			u := usage[a.ShareKey()]
			s := Share{Claim: c.Namespace + "/" + c.Name, ClaimUID: string(c.UID), ShareID: string(*a.ShareID), UUID: rec.UUID,
				Slice: rec.Slice, Used: u.UsedBytes, Processes: u.Processes, Tier: rec.Tier, Kills: u.Kills}
			out = append(out, s)
			live[rec.UUID] = append(live[rec.UUID], u)
		}
	}
	if o.Live != nil {
		if err := measure(ctx, o, out, live); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UUID != out[j].UUID {
			return out[i].UUID < out[j].UUID
		}
		return out[i].Claim+out[i].ShareID < out[j].Claim+out[j].ShareID
	})
	return out, nil
}

// measure sets each share's used memory from NVML now: the processes on
// its GPU whose pod is one of the share's pods.
func measure(ctx context.Context, o ListOptions, out []Share, usage map[string][]police.ShareUsage) error {
	procRoot := o.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	index := map[string]int{}
	for uuid := range usage {
		index[uuid] = 0
	}
	for uuid := range index {
		procs, err := o.Live.Processes(ctx, uuid)
		if err != nil {
			return fmt.Errorf("GPU %s: %w", uuid, err)
		}
		n := 0
		for i := range out {
			if out[i].UUID != uuid {
				continue
			}
			u := usage[uuid][n]
			n++
			out[i].Used, out[i].Processes = 0, 0
			for _, p := range procs {
				pod, err := police.PodOf(procRoot, int(p.PID))
				if err == nil && slices.Contains(u.Pods, pod) {
					out[i].Used += p.UsedBytes
					out[i].Processes++
				}
			}
		}
	}
	return nil
}

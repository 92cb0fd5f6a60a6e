package prepare

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// ClaimInfoDir is where, inside a container, each claim's allocation is
// mounted as <claim uid>.json.
const ClaimInfoDir = "/run/carve/claims"

// standardEnv tells a container which device and share it got, by request:
// CARVE_<REQUEST>_DEVICE, _SHARE_ID, _CLAIM and one variable per consumed
// capacity, e.g. CARVE_NET_EGRESSBANDWIDTH=100M.
func standardEnv(a Allocation, claimUID types.UID) []string {
	prefix := a.EnvPrefix()
	env := []string{prefix + "DEVICE=" + a.Device, prefix + "KIND=" + a.Kind, prefix + "CLAIM=" + string(claimUID),
		prefix + "INFO=" + filepath.Join(ClaimInfoDir, string(claimUID)+".json")}
	if a.ShareID != nil {
		env = append(env, prefix+"SHARE_ID="+string(*a.ShareID))
	}
	names := make([]string, 0, len(a.Consumed))
	for n := range a.Consumed {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		q := a.Consumed[resourceapi.QualifiedName(n)]
		env = append(env, prefix+envToken(n)+"="+q.String())
	}
	return env
}

func envToken(s string) string {
	return strings.ToUpper(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s))
}

func (d *Driver) claimInfoPath(uid types.UID) string {
	return filepath.Join(d.opts.StateDir, "claims", string(uid)+".json")
}

// writeClaimInfo writes the file a claim's containers see at
// /run/carve/claims/<uid>.json: its devices, shares and capacities.
func (d *Driver) writeClaimInfo(rec ClaimRecord) error {
	type device struct {
		Request  string            `json:"request"`
		Device   string            `json:"device"`
		Kind     string            `json:"kind"`
		ShareID  *types.UID        `json:"shareID,omitempty"`
		Consumed map[string]string `json:"consumed,omitempty"`
	}
	info := struct {
		Claim   string   `json:"claim"`
		UID     string   `json:"uid"`
		Devices []device `json:"devices"`
	}{Claim: rec.Namespace + "/" + rec.Name, UID: string(rec.UID)}
	for _, a := range rec.Allocations {
		dv := device{Request: a.Request, Device: a.Device, Kind: a.Kind, ShareID: a.ShareID}
		for n, q := range a.Consumed {
			if dv.Consumed == nil {
				dv.Consumed = map[string]string{}
			}
			dv.Consumed[string(n)] = q.String()
		}
		info.Devices = append(info.Devices, dv)
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Replace(d.claimInfoPath(rec.UID), b, 0o644)
}

// removeStaleClaimFiles removes the claim files left by an earlier boot:
// their records are dropped on read, and nothing they describe exists. Only
// files older than the boot go, so that a file another agent (a rolling
// update) is writing now is never taken for a stale one.
func removeStaleClaimFiles(stateDir string, recs map[types.UID]ClaimRecord) {
	booted, err := bootTime()
	if err != nil {
		return
	}
	files, _ := filepath.Glob(filepath.Join(stateDir, "claims", "*.json"))
	for _, f := range files {
		uid := types.UID(strings.TrimSuffix(filepath.Base(f), ".json"))
		st, err := os.Stat(f)
		if _, ok := recs[uid]; !ok && err == nil && st.ModTime().Before(booted) {
			_ = os.Remove(f)
		}
	}
}

// bootTime is when the running kernel booted (btime in /proc/stat).
func bootTime() (time.Time, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime %q: %w", v, err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat has no btime")
}

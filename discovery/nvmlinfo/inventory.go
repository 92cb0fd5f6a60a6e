package nvmlinfo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Inventory is what NVML reports about a node's GPUs.
type Inventory struct {
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is NVML's integer form: 13000 is CUDA 13.0.
	CUDADriverVersion int      `json:"cudaDriverVersion"`
	Devices           []Device `json:"devices"`
	// Events are what a replay delivers over time (see Event); absent in
	// what carve reads from a real NVML.
	Events []Event `json:"events,omitempty"`
	// Unread says what NVML could not answer and carve left out: a GPU
	// (lost, in reset, or refusing a call) or one MIG profile of a GPU.
	// The other GPUs are read and published all the same.
	Unread []string `json:"unread,omitempty"`
}

// Device is one GPU.
type Device struct {
	Index int    `json:"index"`
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// PCIBusID is NVML's form, with an 8-digit domain: "00000000:19:00.0".
	PCIBusID          string `json:"pciBusId"`
	MemoryTotalBytes  uint64 `json:"memoryTotalBytes"`
	Architecture      string `json:"architecture"`
	ComputeCapability string `json:"computeCapability"`
	MIGCapable        bool   `json:"migCapable"`
	MIGEnabled        bool   `json:"migEnabled"`
	// PersistenceMode is NVML's persistence mode; nil where NVML did not
	// answer it (and in files written before carve read it).
	PersistenceMode *bool `json:"persistenceMode,omitempty"`
	// MIGProfiles are the GPU-instance profiles with the placements NVML
	// reports. Nil (absent) in a replay file means "use the mock's table
	// for this product"; an empty list means the GPU reports none.
	MIGProfiles []MIGProfile `json:"migProfiles,omitempty"`
	// Instances are the GPU instances that exist on a MIG-enabled GPU, as
	// NVML lists them (whoever made them).
	Instances []MIGInstance `json:"instances,omitempty"`
}

// MIGInstance is a GPU instance that exists: its profile's Id and its
// placement.
type MIGInstance struct {
	ProfileID int `json:"profileId"`
	Start     int `json:"start"`
	Size      int `json:"size"`
}

// Overlaps reports whether the instance holds any memory slice of pl.
func (in MIGInstance) Overlaps(pl Placement) bool {
	return in.Start < pl.End() && pl.Start < in.Start+in.Size
}

// MIGProfile is one GPU-instance profile. NVML numbers a profile twice:
// the index that GetGpuInstanceProfileInfo takes, and the Id it answers,
// which placements, instance creation and existing instances use. On a
// real card they differ (an H100's 1g.10gb is index 0, Id 19); go-nvml's
// mock uses one number for both.
type MIGProfile struct {
	// ProfileIndex is NVML's GPU_INSTANCE_PROFILE_* constant, the
	// argument of GetGpuInstanceProfileInfo. NoProfileIndex where a
	// replay file written before it was recorded leaves it out; the
	// replay derives it (see gpu.DeriveProfileIndices).
	ProfileIndex int `json:"profileIndex"`
	// ProfileID is the Id NVML gives the profile (info.Id).
	ProfileID int `json:"profileId"`
	// Name is NVML's name without its "MIG " prefix, e.g. "3g.40gb".
	Name                string      `json:"name"`
	SliceCount          int         `json:"sliceCount"`
	InstanceCount       int         `json:"instanceCount"`
	MemorySizeMB        uint64      `json:"memorySizeMB"`
	MultiprocessorCount int         `json:"multiprocessorCount"`
	Placements          []Placement `json:"placements"`
	// Engines are the profile's engines as NVML counts them; nil in a
	// replay file written before they were recorded.
	Engines *Engines `json:"engines,omitempty"`
}

// Engines are the engines of a GPU instance of a profile, in NVML's
// GpuInstanceProfileInfo fields. The optical-flow accelerator (OFA) is the
// engine a GPU has one of, which only its media-extension profile and its
// whole-GPU profile hold.
type Engines struct {
	CopyEngines int `json:"copyEngineCount"`
	Decoders    int `json:"decoderCount"`
	Encoders    int `json:"encoderCount"`
	JPEGs       int `json:"jpegCount"`
	OFAs        int `json:"ofaCount"`
}

// NoProfileIndex marks a profile whose file did not say its index.
const NoProfileIndex = -1

// UnmarshalJSON decodes a profile strictly, leaving ProfileIndex at
// NoProfileIndex where the file has none: 0 is a real index (1_SLICE).
func (p *MIGProfile) UnmarshalJSON(b []byte) error {
	type plain MIGProfile
	v := plain{ProfileIndex: NoProfileIndex}
	dec := json.NewDecoder(bytes.NewReader(b))
	// The outer decoder's strictness does not reach a custom decoder.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*p = MIGProfile(v)
	return nil
}

// Placement is where an instance of a profile may start and how many memory
// slices it spans, in NVML's units.
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is the first memory slice after the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether two placements share a memory slice.
func (p Placement) Overlaps(o Placement) bool { return p.Start < o.End() && o.Start < p.End() }

// Decode reads an inventory strictly: unknown keys, trailing data and values
// that make no sense are errors that name the field.
func Decode(r io.Reader) (*Inventory, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var inv Inventory
	if err := dec.Decode(&inv); err != nil {
		return nil, fmt.Errorf("decode NVML inventory: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode NVML inventory: data after the JSON object")
	}
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	return &inv, nil
}

// Encode writes the inventory as indented JSON.
func Encode(w io.Writer, inv *Inventory) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(inv); err != nil {
		return fmt.Errorf("encode NVML inventory: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

var computeCapability = regexp.MustCompile(`^[0-9]+\.[0-9]+$`)

// Validate checks what carve relies on: unique indexes, minors and UUIDs,
// parseable bus IDs and compute capabilities, and placements that fit.
func (inv *Inventory) Validate() error {
	if err := inv.validateEvents(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, d := range inv.Devices {
		field := fmt.Sprintf("devices[%d]", i)
		for _, key := range []string{fmt.Sprintf("index %d", d.Index), fmt.Sprintf("minor %d", d.Minor), "uuid " + d.UUID} {
			if seen[key] {
				return fmt.Errorf("%s: duplicate %s", field, key)
			}
			seen[key] = true
		}
		switch {
		case d.Index < 0 || d.Minor < 0:
			return fmt.Errorf("%s: negative index or minor", field)
		case d.UUID == "":
			return fmt.Errorf("%s.uuid: empty", field)
		case d.ComputeCapability != "" && !computeCapability.MatchString(d.ComputeCapability):
			return fmt.Errorf("%s.computeCapability: %q is not MAJOR.MINOR", field, d.ComputeCapability)
		case d.MIGEnabled && !d.MIGCapable:
			return fmt.Errorf("%s: migEnabled without migCapable", field)
		}
		if d.PCIBusID != "" {
			if _, err := NormalizeBusID(d.PCIBusID); err != nil {
				return fmt.Errorf("%s.pciBusId: %w", field, err)
			}
		}
		for j, p := range d.MIGProfiles {
			pf := fmt.Sprintf("%s.migProfiles[%d]", field, j)
			if p.Name == "" || p.SliceCount <= 0 || p.ProfileID < 0 || p.ProfileIndex < NoProfileIndex {
				return fmt.Errorf("%s: needs a name, a positive sliceCount, a profileId >= 0 and a profileIndex >= 0 where given", pf)
			}
			if p.Engines != nil && (p.Engines.CopyEngines < 0 || p.Engines.Decoders < 0 || p.Engines.Encoders < 0 || p.Engines.JPEGs < 0 || p.Engines.OFAs < 0) {
				return fmt.Errorf("%s.engines: negative count", pf)
			}
			for k, pl := range p.Placements {
				if pl.Start < 0 || pl.Size <= 0 || pl.End() > MaxMemorySlices {
					return fmt.Errorf("%s.placements[%d]: start %d size %d outside 0..%d", pf, k, pl.Start, pl.Size, MaxMemorySlices)
				}
			}
		}
		for j, in := range d.Instances {
			if in.ProfileID < 0 || in.Start < 0 || in.Size <= 0 || in.Start+in.Size > MaxMemorySlices || !d.MIGEnabled {
				return fmt.Errorf("%s.instances[%d]: profileId %d start %d size %d: needs MIG enabled, a profileId >= 0 and a placement within 0..%d", field, j, in.ProfileID, in.Start, in.Size, MaxMemorySlices)
			}
		}
	}
	return nil
}

// MaxMemorySlices bounds a GPU's placement space: a counter set holds at most
// 32 counters, three of which are memory, multiprocessors and media
// extensions.
const MaxMemorySlices = 29

var busID = regexp.MustCompile(`^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$`)

// NormalizeBusID turns NVML's bus ID (8-digit domain, often upper case) into
// the sysfs form discovery uses: "00000000:19:00.0" becomes "0000:19:00.0".
func NormalizeBusID(id string) (string, error) {
	m := busID.FindStringSubmatch(strings.TrimSpace(id))
	if m == nil {
		return "", fmt.Errorf("%q is not a PCI bus ID", id)
	}
	domain := strings.ToLower(m[1])
	if len(domain) > 4 {
		if strings.Trim(domain[:len(domain)-4], "0") != "" {
			return "", fmt.Errorf("%q: PCI domain wider than 16 bits", id)
		}
		domain = domain[len(domain)-4:]
	}
	return fmt.Sprintf("%s:%s:%s.%s", domain, strings.ToLower(m[2]), strings.ToLower(m[3]), m[4]), nil
}

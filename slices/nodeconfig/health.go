package nodeconfig

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Health configures how carve taints a device it finds unhealthy and when
// the taint clears.
type Health struct {
	// HoldDown is how long a device must stay healthy before its taint
	// clears (DefaultHoldDown when unset), as a Go duration ("30s").
	HoldDown string `json:"holdDown,omitempty"`
	// MaxHoldDown caps the hold-down of a device that keeps failing
	// again while it is held down: each such flap doubles its hold-down
	// up to this (8 × HoldDown when unset).
	MaxHoldDown string `json:"maxHoldDown,omitempty"`
	// Effects are the taint effects by severity: "degraded" (the device
	// works, worse: a link down, errors) NoSchedule by default, so that
	// running pods stay; "lost" (the device is gone) NoExecute.
	Effects map[string]string `json:"effects,omitempty"`
	// Reasons override the effect for a reason (a taint's value, such as
	// LinkDown or XID79): an admin who wants pods off a NIC whose link is
	// down sets {LinkDown: NoExecute}.
	Reasons map[string]string `json:"reasons,omitempty"`
	// ErrorsPerSecond is the floor of the NIC error check: a NIC is
	// degraded (ErrorRate) when its hardware errors (rx_errors, tx_errors,
	// rx_missed_errors; never drops, which a tenant drives) grow at least
	// this fast and past ErrorsPerMillion of its packets. 0 means
	// DefaultErrorsPerSecond, a negative value turns the check off.
	ErrorsPerSecond int64 `json:"errorsPerSecond,omitempty"`
	// ErrorsPerMillion is that part of the NIC's packets, in millionths
	// (0 means DefaultErrorsPerMillion, 1%).
	ErrorsPerMillion int64 `json:"errorsPerMillion,omitempty"`
}

// Health defaults.
const (
	DefaultHoldDown         = 30 * time.Second
	DefaultErrorsPerSecond  = 10
	DefaultErrorsPerMillion = 10000
	SeverityDegraded        = "degraded"
	SeverityLost            = "lost"
	EffectNoSchedule        = "NoSchedule"
	EffectNoExecute         = "NoExecute"
	EffectNone              = "None"
)

// HoldDownOrDefault is the parsed hold-down, and its cap.
func (h Health) HoldDownOrDefault() (holdDown, maxHoldDown time.Duration) {
	holdDown = DefaultHoldDown
	if d, err := time.ParseDuration(h.HoldDown); err == nil && d > 0 {
		holdDown = d
	}
	maxHoldDown = 8 * holdDown
	if d, err := time.ParseDuration(h.MaxHoldDown); err == nil && d >= holdDown {
		maxHoldDown = d
	}
	return holdDown, maxHoldDown
}

// Effect is the taint effect for a reason of a severity ("degraded" or
// "lost"): the reason's override, else the severity's, else the default.
func (h Health) Effect(severity, reason string) string {
	if e, ok := h.Reasons[reason]; ok {
		return e
	}
	if e, ok := h.Effects[severity]; ok {
		return e
	}
	if severity == SeverityLost {
		return EffectNoExecute
	}
	return EffectNoSchedule
}

// ErrorRate is the NIC error rate limit; 0 where the check is off.
func (h Health) ErrorRate() int64 {
	switch {
	case h.ErrorsPerSecond < 0:
		return 0
	case h.ErrorsPerSecond == 0:
		return DefaultErrorsPerSecond
	}
	return h.ErrorsPerSecond
}

// ErrorPart is the part of a NIC's packets, in millionths, past which its
// hardware errors degrade it.
func (h Health) ErrorPart() int64 {
	if h.ErrorsPerMillion == 0 {
		return DefaultErrorsPerMillion
	}
	return h.ErrorsPerMillion
}

func validEffect(e string) bool {
	return e == EffectNoSchedule || e == EffectNoExecute || e == EffectNone
}

func (h Health) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, s := range map[string]string{"holdDown": h.HoldDown, "maxHoldDown": h.MaxHoldDown} {
		if s == "" {
			continue
		}
		if d, err := time.ParseDuration(s); err != nil || d <= 0 {
			errs = append(errs, field.Invalid(p.Child(name), s, "must be a positive duration such as 30s"))
		}
	}
	if h.MaxHoldDown != "" && h.HoldDown != "" {
		hd, _ := time.ParseDuration(h.HoldDown)
		if m, err := time.ParseDuration(h.MaxHoldDown); err == nil && m < hd {
			errs = append(errs, field.Invalid(p.Child("maxHoldDown"), h.MaxHoldDown, "must not be shorter than holdDown"))
		}
	}
	if h.ErrorsPerMillion < 0 || h.ErrorsPerMillion > 1_000_000 {
		errs = append(errs, field.Invalid(p.Child("errorsPerMillion"), h.ErrorsPerMillion, "must be between 0 and 1000000 (a part of the NIC's packets, in millionths)"))
	}
	for sev, e := range h.Effects {
		if sev != SeverityDegraded && sev != SeverityLost {
			errs = append(errs, field.NotSupported(p.Child("effects").Key(sev), sev, []string{SeverityDegraded, SeverityLost}))
		}
		if !validEffect(e) {
			errs = append(errs, field.NotSupported(p.Child("effects").Key(sev), e, []string{EffectNoSchedule, EffectNoExecute, EffectNone}))
		}
	}
	for reason, e := range h.Reasons {
		if msgs := validation.IsValidLabelValue(reason); len(msgs) > 0 || reason == "" {
			errs = append(errs, field.Invalid(p.Child("reasons").Key(reason), reason, fmt.Sprintf("a reason is a taint value: %v", msgs)))
		}
		if !validEffect(e) {
			errs = append(errs, field.NotSupported(p.Child("reasons").Key(reason), e, []string{EffectNoSchedule, EffectNoExecute, EffectNone}))
		}
	}
	return errs
}

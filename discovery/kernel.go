package discovery

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// KernelFeatures is what the running kernel offers for enforcing shares, read
// from its build configuration. Known is false where no configuration could
// be read; then nothing is assumed.
type KernelFeatures struct {
	Known bool
	// Source is the file the configuration came from.
	Source string

	BPF     bool // CONFIG_BPF_SYSCALL
	TCX     bool // CONFIG_NET_XGRESS: tcx attachment
	Clsact  bool // CONFIG_NET_SCH_INGRESS: clsact qdisc
	ClsBPF  bool // CONFIG_NET_CLS_BPF
	HTB     bool // CONFIG_NET_SCH_HTB
	FQ      bool // CONFIG_NET_SCH_FQ: EDT pacing
	IFB     bool // CONFIG_IFB: ingress shaping through an IFB device
	Mirred  bool // CONFIG_NET_ACT_MIRRED: redirecting ingress to the IFB
	U32     bool // CONFIG_NET_CLS_U32: the filter that carries the redirect
	Macvlan bool // CONFIG_MACVLAN
	IPVlan  bool // CONFIG_IPVLAN
	// Resctrl is CONFIG_X86_CPU_RESCTRL; whether it is mounted is an
	// LLC property.
	Resctrl bool
}

// CanAttachTC reports whether a tc BPF program can be attached at all.
func (k KernelFeatures) CanAttachTC() bool {
	return k.BPF && (k.TCX || (k.Clsact && k.ClsBPF))
}

// CanShapeEgress reports whether a share's egress can be held to a rate: by
// EDT with fq, or by HTB classes chosen by the BPF classifier.
func (k KernelFeatures) CanShapeEgress() bool {
	return k.CanAttachTC() && (k.FQ || k.HTB)
}

// CanShapeIngress reports whether a share's ingress can be held to a rate
// without starving TCP: redirected through an IFB device shaped with HTB.
func (k KernelFeatures) CanShapeIngress() bool {
	return k.CanAttachTC() && k.IFB && k.HTB && k.Mirred && k.U32
}

// CanShareNIC reports whether bandwidth shares of a NIC can be enforced in
// both directions, and with which kind of child interface.
func (k KernelFeatures) CanShareNIC() bool {
	return k.CanShapeEgress() && k.CanShapeIngress() && (k.Macvlan || k.IPVlan)
}

// readKernelFeatures reads proc/config.gz, or boot/config-<release>.
func (t tree) readKernelFeatures() (KernelFeatures, error) {
	text, source, err := t.kernelConfig()
	if err != nil || source == "" {
		return KernelFeatures{}, err
	}
	opts, err := ParseKernelConfig(text)
	if err != nil {
		return KernelFeatures{}, fmt.Errorf("parse %s: %w", source, err)
	}
	on := func(name string) bool {
		v := opts["CONFIG_"+name]
		return v == "y" || v == "m"
	}
	return KernelFeatures{
		Known: true, Source: source,
		BPF: on("BPF_SYSCALL"), TCX: on("NET_XGRESS"), Clsact: on("NET_SCH_INGRESS"),
		ClsBPF: on("NET_CLS_BPF"), HTB: on("NET_SCH_HTB"), FQ: on("NET_SCH_FQ"),
		IFB: on("IFB"), Mirred: on("NET_ACT_MIRRED"), U32: on("NET_CLS_U32"), Macvlan: on("MACVLAN"), IPVlan: on("IPVLAN"),
		Resctrl: on("X86_CPU_RESCTRL"),
	}, nil
}

func (t tree) kernelConfig() (text, source string, err error) {
	if b, err := os.ReadFile(t.path("proc/config.gz")); err == nil {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return "", "", fmt.Errorf("read %s: %w", t.path("proc/config.gz"), err)
		}
		// Kernel configs are a few hundred KiB; the limit guards
		// against a corrupt stream.
		plain, err := io.ReadAll(io.LimitReader(zr, 16<<20))
		if err != nil {
			return "", "", fmt.Errorf("read %s: %w", t.path("proc/config.gz"), err)
		}
		return string(plain), t.path("proc/config.gz"), nil
	}
	release, ok, err := t.optionalString("proc/sys/kernel/osrelease")
	if err != nil || !ok {
		return "", "", err
	}
	rel := filepath.Join("boot", "config-"+release)
	s, ok, err := t.optionalString(rel)
	if err != nil || !ok {
		return "", "", err
	}
	return s, t.path(rel), nil
}

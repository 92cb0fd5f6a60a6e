package discovery

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// KernelFeatures is what the kernel offers for enforcing shares: probed in
// the running kernel (see Options.KernelProbe), or read from its build
// configuration. Known is false where neither could say; then nothing is
// assumed.
type KernelFeatures struct {
	Known bool
	// Source is the file the configuration came from, or "probe" where
	// the running kernel was tried.
	Source string

	BPF     bool // CONFIG_BPF_SYSCALL
	TCX     bool // CONFIG_NET_XGRESS: tcx attachment
	Clsact  bool // CONFIG_NET_SCH_INGRESS: clsact qdisc
	ClsBPF  bool // CONFIG_NET_CLS_BPF
	HTB     bool // CONFIG_NET_SCH_HTB
	FQ      bool // CONFIG_NET_SCH_FQ: EDT pacing, which carve does not use
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
// HTB classes, on the parent's egress shaper, chosen by the BPF classifier.
// (fq is not used: EDT pacing needs fq at the parent's root, which every
// other sender on the parent would then pay for.)
func (k KernelFeatures) CanShapeEgress() bool {
	return k.CanAttachTC() && k.HTB
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

// ProbeSource is KernelFeatures.Source for features probed in the running
// kernel.
const ProbeSource = "probe"

// kernelFeatures asks probe where the root describes the running kernel
// (its boot id is this process's) and probe is set; otherwise, or where the
// probe fails, it reads the root's kernel configuration. A snapshot or a
// fixture root describes another kernel: only its configuration can say.
func (t tree) kernelFeatures(ctx context.Context, probe func(context.Context) (KernelFeatures, error), cache *kernelConfigCache) (KernelFeatures, error) {
	if probe != nil && t.isRunningKernel() {
		k, err := probe(ctx)
		if err == nil {
			k.Known, k.Source = true, ProbeSource
			return k, nil
		}
		klog.FromContext(ctx).V(1).Info("Kernel features not probed; reading the kernel configuration", "err", err)
	}
	return t.readKernelFeatures(cache)
}

// isRunningKernel reports whether root's procfs is the running kernel's,
// by boot id.
func (t tree) isRunningKernel() bool {
	const bootID = "proc/sys/kernel/random/boot_id"
	mine, ok, err := tree{root: "/"}.optionalString(bootID)
	if err != nil || !ok || mine == "" {
		return false
	}
	theirs, ok, err := t.optionalString(bootID)
	return err == nil && ok && theirs == mine
}

// kernelConfigCache holds the features of the last configuration a Scanner
// read, for as long as its file is unchanged: unzipping /proc/config.gz on
// every rescan was a few milliseconds each time.
type kernelConfigCache struct {
	path    string
	size    int64
	modTime time.Time
	k       KernelFeatures
}

// readKernelFeatures reads proc/config.gz, or boot/config-<release>.
func (t tree) readKernelFeatures(c *kernelConfigCache) (KernelFeatures, error) {
	path, ok, err := t.kernelConfigPath()
	if err != nil || !ok {
		return KernelFeatures{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return KernelFeatures{}, fmt.Errorf("read %s: %w", path, err)
	}
	if c.path == path && c.size == st.Size() && c.modTime.Equal(st.ModTime()) && st.Size() > 0 {
		return c.k, nil
	}
	text, err := readKernelConfig(path)
	if err != nil {
		return KernelFeatures{}, err
	}
	k, err := featuresOfConfig(text, path)
	if err != nil {
		return KernelFeatures{}, err
	}
	c.path, c.size, c.modTime, c.k = path, st.Size(), st.ModTime(), k
	return k, nil
}

func featuresOfConfig(text, source string) (KernelFeatures, error) {
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

// kernelConfigPath is proc/config.gz where it exists, else
// boot/config-<release>; ok is false where neither does.
func (t tree) kernelConfigPath() (string, bool, error) {
	if _, err := os.Stat(t.path("proc/config.gz")); err == nil {
		return t.path("proc/config.gz"), true, nil
	}
	release, ok, err := t.optionalString("proc/sys/kernel/osrelease")
	if err != nil || !ok {
		return "", false, err
	}
	p := t.path(filepath.Join("boot", "config-"+release))
	if _, err := os.Stat(p); err != nil {
		return "", false, nil
	}
	return p, true, nil
}

func readKernelConfig(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if !strings.HasSuffix(path, ".gz") {
		return string(b), nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	// Kernel configs are a few hundred KiB; the limit guards against a
	// corrupt stream.
	plain, err := io.ReadAll(io.LimitReader(zr, 16<<20))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return string(plain), nil
}

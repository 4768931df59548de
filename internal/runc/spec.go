package runc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Spec is the plain description of one container from which WriteBundle
// produces config.json. It holds only what edgehop varies; everything else
// gets runc's `runc spec` defaults (see WriteBundle).
type Spec struct {
	// Rootfs is the absolute path of the unpacked (or overlay-mounted)
	// root filesystem. It is used as is; WriteBundle never touches it.
	Rootfs string
	// Args is the command line of the container's init process; required.
	Args []string
	// Env is the process environment; a default PATH is added when Env
	// has none.
	Env []string
	// Cwd is the working directory; "/" when empty.
	Cwd string
	// UID, GID and Groups are the process's credentials (root when
	// zero): the image's User, resolved in its own /etc/passwd.
	UID, GID uint32
	Groups   []uint32
	// Hostname is set in the container's own UTS namespace when not empty.
	Hostname string
	// NetNSPath is the bind-mounted network namespace to join (created by
	// the caller). When empty the container gets a fresh, empty network
	// namespace. With a path, runc's checkpoint records the namespace as
	// external and restore re-binds it to the path in the restore
	// bundle's config.json, which is how a migrated container lands in
	// the destination's namespace.
	NetNSPath string
	// ReadonlyRootfs mounts the root filesystem read-only.
	ReadonlyRootfs bool
	// Mounts are added after the default /proc, /dev, /sys mounts.
	Mounts []specs.Mount
	// ShmDir, when set, is bound at /dev/shm instead of a tmpfs there:
	// its files are then kept by whoever keeps the directory, and CRIU,
	// which dumps a tmpfs with tar inside the frozen window, leaves it out
	// of the images as it does every bind mount. It must be an absolute
	// path; mode 1777 as a tmpfs /dev/shm is.
	ShmDir string
	// DevDir, when set, is bound at /dev instead of a tmpfs there, and
	// runc creates nothing in it: MakeDevDir must have filled it. CRIU
	// leaves it out of the images as every bind mount. An absolute path.
	DevDir string
	// MemoryLimit is the memory cgroup limit in bytes; 0 means none.
	MemoryLimit int64
	// PidsLimit bounds the container's tasks (pids cgroup); 0 means none.
	PidsLimit int64
	// CPUMillis is the container's CPU quota in thousandths of a CPU
	// (1500: one and a half CPUs, as a CFS quota of 150 ms per 100 ms
	// period); 0 means none.
	CPUMillis int64
	// CgroupsPath is the container's cgroup path below each hierarchy's
	// root. Containers on different emulated nodes of one host share the
	// host's cgroupfs, so callers should make it unique per host (for
	// example "/edgehop/<testbed>/<node>/<id>"); when empty runc uses
	// "/<container id>", which collides between nodes.
	CgroupsPath string
	// Capabilities replaces the default capability set (bounding,
	// effective, permitted) when not nil.
	Capabilities []string
	// Annotations are copied into config.json.
	Annotations map[string]string
	// Seccomp is the syscall filter; nil: none. DefaultSeccomp gives the
	// container engines' default profile.
	Seccomp *specs.LinuxSeccomp
}

// cpuPeriodUs is the CFS period of a CPU quota (the kernel's default);
// the kernel refuses a quota below minCPUQuotaUs.
const (
	cpuPeriodUs   = 100_000
	minCPUQuotaUs = 1000
)

// DefaultCapabilities is the capability set a container gets when
// Spec.Capabilities is nil: the set container engines grant by default,
// enough for common services that drop privileges or bind low ports,
// less CAP_MKNOD and CAP_NET_RAW. There is no user namespace, so the
// container's root is the host's: with CAP_MKNOD it could make a block
// device node in its writable layer, which lies on the host's file
// system, and with CAP_NET_RAW send frames with any source MAC and IP
// onto its node's bridge. A service that needs one asks for it
// (WithCapabilities, `edgehop run --cap-add`).
//
// CAP_FSETID and CAP_FOWNER stay: package managers run inside containers
// (dpkg chmods and chowns files it does not own, keeping setuid bits),
// and the setuid files they let root make are harmless: the root file
// system is mounted nosuid and nodev (linux.MountOverlay), the processes
// have no_new_privs, and the writable layer's host directory is reachable
// by root alone (the agent's state directories are 0700).
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// KnownCapabilities are the capability names Spec.Capabilities and
// WithCapabilities accept: Linux's, in bit order (capability(7)).
var KnownCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// ErrUnknownCapability is returned for a name that is not in
// KnownCapabilities.
var ErrUnknownCapability = errors.New("unknown capability")

// ParseCapability returns the canonical name of capability name
// ("CAP_NET_RAW"), given in any case, with or without the "CAP_" prefix;
// ErrUnknownCapability for a name not in KnownCapabilities.
func ParseCapability(name string) (string, error) {
	c := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(c, "CAP_") {
		c = "CAP_" + c
	}
	if !slices.Contains(KnownCapabilities, c) {
		return "", fmt.Errorf("%w %q (want one of %s)", ErrUnknownCapability, name, strings.Join(KnownCapabilities, ", "))
	}
	return c, nil
}

// WithCapabilities returns DefaultCapabilities plus add (ParseCapability
// names; duplicates and defaults are dropped), for Spec.Capabilities. The
// order is deterministic, so that a container's source and destination
// write the same set.
func WithCapabilities(add []string) ([]string, error) {
	caps := slices.Clone(DefaultCapabilities)
	for _, a := range add {
		c, err := ParseCapability(a)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(caps, c) {
			caps = append(caps, c)
		}
	}
	return caps, nil
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Validate reports what is missing or malformed in s.
func (s Spec) Validate() error {
	var errs []error
	if s.Rootfs == "" || !filepath.IsAbs(s.Rootfs) {
		errs = append(errs, fmt.Errorf("rootfs %q must be an absolute path", s.Rootfs))
	}
	if len(s.Args) == 0 {
		errs = append(errs, errors.New("args must not be empty"))
	}
	if s.Cwd != "" && !filepath.IsAbs(s.Cwd) {
		errs = append(errs, fmt.Errorf("cwd %q must be absolute", s.Cwd))
	}
	if s.NetNSPath != "" && !filepath.IsAbs(s.NetNSPath) {
		errs = append(errs, fmt.Errorf("netns path %q must be absolute", s.NetNSPath))
	}
	if s.MemoryLimit < 0 {
		errs = append(errs, fmt.Errorf("memory limit %d is negative", s.MemoryLimit))
	}
	if s.PidsLimit < 0 {
		errs = append(errs, fmt.Errorf("pids limit %d is negative", s.PidsLimit))
	}
	if s.CPUMillis < 0 || (s.CPUMillis > 0 && s.CPUMillis*cpuPeriodUs/1000 < minCPUQuotaUs) {
		errs = append(errs, fmt.Errorf("cpu quota of %d millicpus: want 0 (none) or at least %d", s.CPUMillis, minCPUQuotaUs*1000/cpuPeriodUs))
	}
	for what, dir := range map[string]string{"shm": s.ShmDir, "dev": s.DevDir} {
		if dir != "" && !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s dir %q must be an absolute path", what, dir))
		}
	}
	for _, c := range s.Capabilities {
		if !slices.Contains(KnownCapabilities, c) {
			errs = append(errs, fmt.Errorf("%w %q", ErrUnknownCapability, c))
		}
	}
	for _, m := range s.Mounts {
		if !filepath.IsAbs(m.Destination) {
			errs = append(errs, fmt.Errorf("mount destination %q must be absolute", m.Destination))
		}
	}
	return errors.Join(errs...)
}

// Config returns the runtime-spec configuration for s, with the defaults
// of `runc spec` (runc 1.1): pid, ipc, uts, mount and network namespaces,
// no user namespace, no terminal, uid 0, /proc /dev /dev/pts /dev/shm
// /dev/mqueue /sys /sys/fs/cgroup mounts, masked and read-only /proc
// paths, all devices denied except runc's defaults, no new privileges.
func (s Spec) Config() (*specs.Spec, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("invalid spec: %w", err)
	}
	env := append([]string(nil), s.Env...)
	if !hasPath(env) {
		env = append([]string{defaultPath}, env...)
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	caps := s.Capabilities
	if caps == nil {
		caps = DefaultCapabilities
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.NetNSPath}
	resources := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if s.MemoryLimit > 0 {
		limit := s.MemoryLimit
		resources.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if s.PidsLimit > 0 {
		limit := s.PidsLimit
		resources.Pids = &specs.LinuxPids{Limit: &limit}
	}
	if s.CPUMillis > 0 {
		quota, period := s.CPUMillis*cpuPeriodUs/1000, uint64(cpuPeriodUs)
		resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	mounts := append(defaultMounts(s.DevDir, s.ShmDir), s.Mounts...)

	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: s.UID, GID: s.GID, AdditionalGids: append([]uint32(nil), s.Groups...)},
			Args:     append([]string(nil), s.Args...),
			Env:      env,
			Cwd:      cwd,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  append([]string(nil), caps...),
				Effective: append([]string(nil), caps...),
				Permitted: append([]string(nil), caps...),
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:        &specs.Root{Path: s.Rootfs, Readonly: s.ReadonlyRootfs},
		Hostname:    s.Hostname,
		Mounts:      mounts,
		Annotations: s.Annotations,
		Linux: &specs.Linux{
			Resources:   resources,
			CgroupsPath: s.CgroupsPath,
			Seccomp:     s.Seccomp,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				netns,
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
			},
			MaskedPaths: append(append([]string(nil), MaskedDirs...), MaskedFiles...),
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}, nil
}

func hasPath(env []string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return true
		}
	}
	return false
}

func defaultMounts(devDir, shmDir string) []specs.Mount {
	dev := specs.Mount{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}}
	if devDir != "" {
		dev = specs.Mount{Destination: "/dev", Type: "bind", Source: devDir, Options: []string{"rbind", "nosuid", "rw"}}
	}
	shm := specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
		Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}
	if shmDir != "" {
		shm = specs.Mount{Destination: "/dev/shm", Type: "bind", Source: shmDir,
			Options: []string{"rbind", "nosuid", "noexec", "nodev", "rw"}}
	}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		dev,
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
			Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		shm,
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue",
			Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs",
			Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// WriteBundle creates the bundle directory dir (if needed) and writes
// config.json for s into it. The root filesystem stays where s.Rootfs
// points. An existing config.json is replaced atomically.
func WriteBundle(dir string, s Spec) error {
	cfg, err := s.Config()
	if err != nil {
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	data, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".config.json.*")
	if err != nil {
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, "config.json")); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write bundle %s: %w", dir, err)
	}
	return nil
}

// DefaultSeccomp returns the container engines' default seccomp profile
// (moby's, as Docker and containerd use it) for the spec's capabilities.
func DefaultSeccomp(s Spec) (*specs.LinuxSeccomp, error) {
	cfg, err := s.Config()
	if err != nil {
		return nil, err
	}
	return seccomp.GetDefaultProfile(cfg)
}

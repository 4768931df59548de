package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// CRIUConfigAnnotation is the bundle annotation naming the CRIU
// configuration file runc hands to CRIU for checkpoint and restore
// (without it runc names /etc/criu/runc.conf). Options in that file
// override what runc asks for.
const CRIUConfigAnnotation = "org.criu.config"

// SkipNetworkLock is a CRIU configuration that leaves network locking to
// the caller: CRIU neither loads its iptables chain nor adds a rule per
// TCP connection. With iptables-nft each of those is an
// iptables-restore run (10-15 ms here), and a restore with one
// connection ran eight of them inside the frozen window. The caller must
// then keep packets away from the dumped sockets itself (edgehop takes
// the source's veth down and holds the destination's packets).
const SkipNetworkLock = "network-lock skip\n"

// IgnoreCgroups is a CRIU configuration that leaves cgroups to runc. In
// its default (soft) mode CRIU reads every property of the cgroups the
// container sees on dump (its own, bound at /sys/fs/cgroup: about 3 ms of
// the frozen window here) and on restore mounts the hierarchies in a
// yard and writes them back, while runc has already made the container's
// cgroups on the restoring node, set their limits from the bundle and
// moved CRIU into them, so the restored tasks, which CRIU forks, start
// there.
const IgnoreCgroups = "manage-cgroups=ignore\n"

// MaskedDirs are the directories a container sees empty and read-only
// (the OCI spec's masked paths that are directories; runc masks each with
// a read-only tmpfs). MaskedFiles are masked with /dev/null.
var (
	// The last is where a container's volumes live in its writable layer
	// (migration.VolumesDir): bound at their paths, never seen whole.
	MaskedDirs  = []string{"/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware", "/.edgehop-volumes"}
	MaskedFiles = []string{"/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug"}
)

// ExternalMasks is CRIU configuration that keeps the masked directories
// out of the images. CRIU dumps every tmpfs with tar and gzip and restores
// it with tar, 3-5 ms each per side here, and two of the five tmpfs mounts
// of a container are these masks, which hold nothing. Marked external
// (by mount point on dump, by key on restore; each form is ignored by the
// other operation and by containers without that mount), they are bound on
// restore to emptyDir instead, which must be an empty directory on a
// read-only file system (see linux.MountEmptyReadOnly), so the container
// can never write through the mask whatever flags the bind ends up with.
func ExternalMasks(emptyDir string) string {
	var b strings.Builder
	for i, d := range MaskedDirs {
		key := "edgehop-mask" + strconv.Itoa(i)
		fmt.Fprintf(&b, "external mnt[%s]:%s\nexternal mnt[%s]:%s\n", d, key, key, emptyDir)
	}
	return b.String()
}

// WriteCRIUConfig writes a CRIU configuration file (criu(8), one option
// per line) at path, atomically.
func WriteCRIUConfig(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return linux.WriteFileAtomic(path, []byte(content), 0o644)
}

// kerndatCache is where CRIU (as root) keeps what it learnt about the
// kernel; it only writes it when /run is a tmpfs.
const kerndatCache = "/run/criu.kdat"

// WarmKerndat makes sure CRIU finds its kernel-feature cache, so that no
// dump or restore spends ~30 ms probing the kernel inside the frozen
// window. CRIU saves the cache only on a tmpfs /run (it must not outlive
// a reboot); on a machine whose /run is not a tmpfs it never does, and
// every CRIU run probes again. WarmKerndat then runs `criu check` in a
// private mount namespace over a tmpfs /run and installs the cache it
// wrote. A cache older than the boot or than the criu binary is
// replaced. It reports whether it wrote one.
func (r *Runtime) WarmKerndat(ctx context.Context) (bool, error) {
	run, err := linux.StatFileSystem("/run")
	if err != nil {
		return false, fmt.Errorf("statfs /run: %w", err)
	}
	if run.Type == linux.TmpfsMagic {
		return false, nil // CRIU keeps its cache itself
	}
	criu, err := r.criuPath()
	if err != nil {
		return false, err
	}
	if fresh, err := kerndatFresh(criu); err != nil || fresh {
		return false, err
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount -t tmpfs edgehop-kdat /run && "$0" check >/dev/null 2>&1; cat /run/criu.kdat`, criu)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return false, fmt.Errorf("criu kerndat cache: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if len(out) == 0 {
		return false, errors.New("criu kerndat cache: criu check wrote none")
	}
	if err := linux.WriteFileAtomic(kerndatCache, out, 0o600); err != nil {
		return false, fmt.Errorf("criu kerndat cache: %w", err)
	}
	return true, nil
}

// kerndatFresh reports whether the cache exists and was written since the
// boot and since the criu binary was installed.
func kerndatFresh(criu string) (bool, error) {
	fi, err := os.Stat(kerndatCache)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	boot, err := bootTime()
	if err != nil {
		return false, err
	}
	bi, err := os.Stat(criu)
	if err != nil {
		return false, err
	}
	return fi.ModTime().After(boot) && fi.ModTime().After(bi.ModTime()), nil
}

// bootTime is the kernel's boot time ("btime" in /proc/stat).
func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime %q: %w", v, err)
			}
			return time.Unix(s, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat has no btime")
}

package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named namespaces live so that `ip netns` sees them.
const NetNSDir = "/run/netns"

// NetNSPath returns the path of the named namespace name under NetNSDir.
func NetNSPath(name string) string { return filepath.Join(NetNSDir, name) }

// ensureSharedDir makes dir a shared bind mount of itself, as iproute2 does
// for /run/netns, so namespace mounts made later propagate to other mount
// namespaces (runc, nsenter users) instead of pinning stale copies.
func ensureSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err == nil {
		return nil
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// NewNetNS creates a new network namespace and binds it at path. The
// namespace's loopback is brought up, and links created in it later come
// without IPv6 (noIPv6OnNewLinks). It fails if path already exists.
func NewNetNS(path string) error {
	dir := filepath.Dir(path)
	if dir == NetNSDir {
		if err := ensureSharedDir(dir); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer origin.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(src, path, "none", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("bind netns: %w", err)
		} else {
			var lo netlink.Link
			if lo, err = netlink.LinkByName("lo"); err == nil {
				err = netlink.LinkSetUp(lo)
			}
			if err == nil {
				err = noIPv6OnNewLinks()
			}
		}
		// Back to where the thread came from; a thread that cannot go
		// back stays locked and is discarded with this goroutine.
		if netns.Set(origin) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return fmt.Errorf("new netns %s: %w", path, err)
	}
	return nil
}

// noIPv6OnNewLinks makes the links later created in the calling thread's
// network namespace come without IPv6 (lo keeps ::1). The overlay is
// IPv4; an interface with IPv6 on sends neighbour discovery, MLD and
// router solicitations as soon as it is up, from the service's MAC: a
// migration destination's copy would tell every bridge of the overlay
// that the service's MAC lives there while the service still runs on its
// source, whose bridge then drops the service's incoming frames. A
// kernel without IPv6 has nothing to turn off.
func noIPv6OnNewLinks() error {
	// /proc/sys/net resolves to the opening thread's namespace.
	err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disable IPv6 on new links: %w", err)
	}
	return nil
}

// DeleteNetNS unbinds and removes the namespace file at path. A missing
// path is not an error.
func DeleteNetNS(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// InNetNS runs fn on an OS thread switched into the namespace at path, and
// switches the thread back afterwards. A thread that cannot switch back is
// never reused (it stays locked and is discarded), so no goroutine ever
// runs in the wrong namespace.
func InNetNS(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer origin.Close()
		if err := netns.Set(target); err != nil {
			if netns.Set(origin) == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		err = fn()
		if netns.Set(origin) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Handle returns a netlink handle whose requests act inside the namespace
// at path. The caller closes it.
func Handle(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", path, err)
	}
	return h, nil
}

// OpenNetNS opens the namespace at path; the caller closes the handle.
func OpenNetNS(path string) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return ns, fmt.Errorf("open netns %s: %w", path, err)
	}
	return ns, nil
}

// Command returns a command that runs name in the network namespace at
// path (and only that namespace; "" runs it where the caller is: the mount namespace is left alone, which
// CRIU requires).
func Command(path, name string, args ...string) *exec.Cmd {
	if path == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("nsenter", append([]string{"--net=" + path, "--", name}, args...)...)
}

// NetNSInode returns the inode identifying the namespace at path.
func NetNSInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", path, err)
	}
	return st.Ino, nil
}

// PIDsInNetNS lists processes whose network namespace has the given inode.
func PIDsInNetNS(inode uint64) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		if st.Ino == inode {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// MountsUnder returns mount points at or below dir, deepest first, from
// /proc/self/mountinfo.
func MountsUnder(dir string) ([]string, error) {
	ms, err := mountinfo()
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	// Deepest first so children unmount before parents.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// MountsOfType lists the mounts of file systems of type fstype, in
// mount order: where each is mounted and which directory of its file
// system it shows ("/" for a whole cgroup hierarchy, a cgroup's path for
// a bind of it).
func MountsOfType(fstype string) ([]Mount, error) {
	ms, err := mountinfo()
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, m := range ms {
		if m.FSType == fstype {
			out = append(out, m)
		}
	}
	return out, nil
}

// Mount is one line of /proc/self/mountinfo: where, of which type, and
// which directory of its file system it shows.
type Mount struct{ Point, FSType, Root string }

func mountinfo() ([]Mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(string(data)), nil
}

// parseMountinfo reads mountinfo lines ("id parent dev root point options
// [optional...] - fstype source superoptions"); lines too short to name
// a mount point are skipped.
func parseMountinfo(data string) []Mount {
	var out []Mount
	for _, line := range strings.Split(data, "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		m := Mount{Point: unescapeMount(f[4]), Root: unescapeMount(f[3])}
		if t := strings.Fields(post); len(t) > 0 {
			m.FSType = t[0]
		}
		out = append(out, m)
	}
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// UnmountUnder detaches every mount at or below dir, deepest first (as
// MountsUnder lists them), and checks that none is left.
func UnmountUnder(dir string) error {
	mounts, err := MountsUnder(dir)
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
	}
	var errs []error
	for _, m := range mounts {
		errs = append(errs, Unmount(m))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if left, _ := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %s", dir, strings.Join(left, ", "))
	}
	return nil
}

// Unmount detaches the mount at path; not-mounted is not an error.
func Unmount(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

package linux

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// An empty read-only tmpfs stays unwritable through a bind mount whose
// own flags are read-write, which is what a masked path becomes after a
// CRIU restore binds it there.
func TestMountEmptyReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "mask"), filepath.Join(dir, "bind")
	if err := MountEmptyReadOnly(src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(src) })
	if ents, err := os.ReadDir(src); err != nil || len(ents) != 0 {
		t.Fatalf("mask dir: entries %v, err %v; want empty", ents, err)
	}
	if err := os.WriteFile(filepath.Join(src, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write into the mask: %v, want EROFS", err)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(dst) })
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
		t.Fatalf("remount the bind read-write: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dst, "d"), 0o755); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("mkdir through a read-write bind of the mask: %v, want EROFS", err)
	}
}

// TestParseMountinfo: mount points unescaped, types after the separator,
// optional fields skipped, short lines ignored.
func TestParseMountinfo(t *testing.T) {
	data := `36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:12 - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 / /mnt/a\040b rw - tmpfs tmpfs rw
short line
38 25 0:33 / /no/type rw
39 25 0:34 /edgehop/x\040y /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory`
	got := parseMountinfo(data)
	want := []Mount{{"/sys/fs/cgroup/cpu,cpuacct", "cgroup", "/"}, {"/mnt/a b", "tmpfs", "/"}, {"/no/type", "", "/"},
		{"/sys/fs/cgroup/memory", "cgroup", "/edgehop/x y"}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// FuzzParseMountinfo: any text as mountinfo; never a panic, never more
// mounts than lines.
func FuzzParseMountinfo(f *testing.F) {
	f.Add("36 25 0:31 / /sys/fs/cgroup/cpu rw shared:12 - cgroup cgroup rw,cpu\n")
	f.Add(`37 25 0:32 / /a\040b\134 rw - tmpfs tmpfs rw`)
	f.Add(" - - - ")
	f.Fuzz(func(t *testing.T, data string) {
		if ms := parseMountinfo(data); len(ms) > strings.Count(data, "\n")+1 {
			t.Fatalf("%d mounts from %d lines", len(ms), strings.Count(data, "\n")+1)
		}
	})
}

// TestMountOverlayNosuidNodev: a container's root file system is mounted
// nosuid and nodev (/proc/self/mountinfo's per-mount options), so that a
// setuid file or device node its root makes there does not work; its
// work directory is not reachable by other users.
func TestMountOverlayNosuidNodev(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	lower, upper, work, target := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "root")
	if err := os.Mkdir(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := MountOverlay(lower, upper, work, target); err != nil {
		if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EINVAL) {
			// No overlayfs, or a temporary directory on a file system
			// it cannot use as upper layer (an overlay itself).
			t.Skipf("skipped: overlayfs not usable here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(target) })
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && unescapeMount(f[4]) == target {
			opts = strings.Split(f[5], ",")
		}
	}
	if opts == nil {
		t.Fatalf("%s not in /proc/self/mountinfo", target)
	}
	for _, want := range []string{"nosuid", "nodev", "rw"} {
		if !slices.Contains(opts, want) {
			t.Errorf("overlay mount options %v lack %s", opts, want)
		}
	}
	for path, want := range map[string]os.FileMode{upper: 0o755, work: 0o700} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
}

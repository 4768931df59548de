package linux

import (
	"errors"
	"os"
	"path/filepath"
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

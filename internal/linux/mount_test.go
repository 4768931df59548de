package linux

import (
	"errors"
	"os"
	"path/filepath"
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

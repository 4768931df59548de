package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// mountOverlay mounts lower+upper at a new target and unmounts it on
// cleanup. A kernel without overlayfs skips the test.
func mountOverlay(t *testing.T, lower, upper, work, target string) {
	t.Helper()
	if err := linux.MountOverlay(lower, upper, work, target); err != nil {
		if errors.Is(err, syscall.ENODEV) {
			t.Skipf("skipped: overlayfs not available: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := linux.Unmount(target); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// capV2 is a security.capability value (VFS_CAP_REVISION_2, effective)
// granting CAP_NET_BIND_SERVICE.
func capV2() []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001)
	binary.LittleEndian.PutUint32(b[4:], 1<<10)
	return b
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOverlayUpperRoundTrip changes a real overlay the way a container
// does (deletes lower files, replaces a lower directory, hard-links, makes
// special files, sets attributes), sends its upper layer with Overlay,
// mounts the received layer over the same lower layer and checks that both
// the layers and the merged views are identical.
func TestOverlayUpperRoundTrip(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	lower := filepath.Join(base, "lower")
	upper1, upper2 := filepath.Join(base, "upper1"), filepath.Join(base, "recv", "upper2")
	merged1, merged2 := filepath.Join(base, "merged1"), filepath.Join(base, "merged2")

	writeFile(t, filepath.Join(lower, "keep.txt"), []byte("keep"), 0o644)
	writeFile(t, filepath.Join(lower, "gone.txt"), []byte("gone"), 0o644)
	writeFile(t, filepath.Join(lower, "gone2.txt"), []byte("gone too"), 0o644)
	writeFile(t, filepath.Join(lower, "olddir", "a"), []byte("a"), 0o644)
	writeFile(t, filepath.Join(lower, "olddir", "b", "c"), []byte("c"), 0o644)
	writeFile(t, filepath.Join(lower, "shared.txt"), []byte("shared"), 0o644)
	writeFile(t, filepath.Join(lower, "sub", "x"), []byte("x"), 0o644)
	writeFile(t, filepath.Join(lower, "sub", "y"), []byte("y"), 0o644)
	writeFile(t, filepath.Join(lower, "bin", "tool"), []byte("#!/bin/sh\n"), 0o755)
	mountOverlay(t, lower, upper1, filepath.Join(base, "work1"), merged1)

	m := func(p string) string { return filepath.Join(merged1, p) }
	// Whiteouts (the kernel may share one inode between them).
	must(t, os.Remove(m("gone.txt")))
	must(t, os.Remove(m("gone2.txt")))
	// An opaque directory: a lower directory removed and made again.
	must(t, os.RemoveAll(m("olddir")))
	must(t, os.Mkdir(m("olddir"), 0o750))
	writeFile(t, m("olddir/new"), []byte("new"), 0o600)
	// Hard links: a new pair, and a link to a lower file (copied up).
	writeFile(t, m("pair/h1"), []byte("pair"), 0o640)
	must(t, os.Link(m("pair/h1"), m("pair/h2")))
	must(t, os.Link(m("shared.txt"), m("shared-link")))
	// A copied-up file with new content, and attributes on copied-up
	// entries (a file, a directory, file capabilities).
	f, err := os.OpenFile(m("sub/x"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.WriteString(" and more")
	must(t, errors.Join(err, f.Close()))
	must(t, linux.Lsetxattr(m("keep.txt"), "user.note", []byte("kept")))
	must(t, linux.Lsetxattr(m("sub"), "user.dirnote", []byte("dir")))
	must(t, linux.Lsetxattr(m("bin/tool"), "security.capability", capV2()))
	// Special files.
	must(t, linux.Mknod(m("fifo"), fs.ModeNamedPipe, 0o640, 0, 0))
	must(t, linux.Mknod(m("null"), fs.ModeDevice|fs.ModeCharDevice, 0o666, 1, 3))
	must(t, linux.Mknod(m("blk"), fs.ModeDevice, 0o660, 7, 200))
	must(t, linux.Mknod(m("sock"), fs.ModeSocket, 0o755, 0, 0))
	must(t, os.Chmod(m("fifo"), 0o640))
	// Owners, setuid, a symlink, an old directory time.
	writeFile(t, m("suid"), []byte("suid"), 0o755)
	must(t, os.Chown(m("suid"), 1234, 5678))
	must(t, os.Chmod(m("suid"), 0o755|fs.ModeSetuid))
	must(t, os.Symlink("keep.txt", m("ln")))
	old := time.Date(2021, 3, 4, 5, 6, 7, 8000, time.UTC)
	must(t, os.Chtimes(m("olddir"), old, old))

	// The layer really has what this test is about.
	if _, ok := xattrsOf(t, filepath.Join(upper1, "olddir"))["trusted.overlay.opaque"]; !ok {
		t.Fatal("kernel did not mark olddir opaque in the upper layer")
	}
	if !isWhiteout(t, filepath.Join(upper1, "gone.txt")) {
		t.Fatal("kernel did not leave a whiteout for gone.txt")
	}

	// Without Overlay the layer cannot be sent.
	send, recv := transferDir(t, upper1, filepath.Join(base, "recv", "plain"), SendOptions{}, RecvOptions{}, nil)
	if send.err == nil || !strings.Contains(send.err.Error(), "unsupported file type") || !errors.Is(recv.err, ErrAborted) {
		t.Fatalf("plain SendDir of an upper layer: send %v, recv %v; want unsupported file type and ErrAborted", send.err, recv.err)
	}

	// Sent while mounted, as the agent does after the freeze.
	send, recv = transferDir(t, upper1, upper2, SendOptions{Name: "upper", Overlay: true, Compression: CompressZstd}, RecvOptions{}, nil)
	if send.err != nil || recv.err != nil {
		t.Fatalf("send: %v; recv: %v", send.err, recv.err)
	}
	t.Logf("sent %v", send.st)
	if s, r := send.st, recv.st; s.Specials != r.Specials || s.Hardlinks != r.Hardlinks || s.Files != r.Files || s.Dirs != r.Dirs || s.Symlinks != r.Symlinks {
		t.Errorf("counts differ: sender %v, receiver %v", s, r)
	}
	// fifo, null, blk, sock and at least one whiteout; pair/h2, shared-link.
	if send.st.Specials < 5 || send.st.Hardlinks < 2 {
		t.Errorf("sent %d specials and %d hard links, want at least 5 and 2", send.st.Specials, send.st.Hardlinks)
	}
	compareViews(t, upper1, upper2, false)

	mountOverlay(t, lower, upper2, filepath.Join(base, "work2"), merged2)
	compareViews(t, merged1, merged2, true)

	// And the merged view is the changed one, not the lower layer.
	for _, p := range []string{"gone.txt", "gone2.txt", "olddir/a", "olddir/b"} {
		if _, err := os.Lstat(filepath.Join(merged2, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("merged view after transfer has %s: %v", p, err)
		}
	}
	if got := dirNames(t, filepath.Join(merged2, "olddir")); !slices.Equal(got, []string{"new"}) {
		t.Errorf("opaque olddir lists %v, want [new]", got)
	}
	if got, err := os.ReadFile(filepath.Join(merged2, "sub", "x")); err != nil || string(got) != "x and more" {
		t.Errorf("sub/x = %q, %v", got, err)
	}
	if a, b := statOf(t, filepath.Join(merged2, "pair/h1")), statOf(t, filepath.Join(merged2, "pair/h2")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("pair/h1 and h2 are inodes %d and %d with %d links, want one inode with 2", a.Ino, b.Ino, a.Nlink)
	}
}

// TestOverlayEntriesValidated feeds RecvDir special entries that a correct
// sender never produces.
func TestOverlayEntriesValidated(t *testing.T) {
	root := entry{Path: ".", Type: entryDir, Mode: 0o755}
	tests := []struct {
		name string
		e    entry
	}{
		{"host policy xattr", entry{Path: "f", Type: entryFile, Mode: 0o644, Xattrs: map[string][]byte{"security.selinux": []byte("x")}}},
		{"device numbers on a fifo", entry{Path: "p", Type: entryFIFO, Mode: 0o644, Major: 1, Minor: 3}},
		{"file type bits in mode", entry{Path: "c", Type: entryCharDev, Mode: uint32(fs.ModeDevice | 0o644)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			parent := t.TempDir()
			go rawStream(t, a, []entry{root, tc.e}, nil)
			_, err := NewConn(b).RecvDir(context.Background(), filepath.Join(parent, "dst"), RecvOptions{})
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("got %v, want ErrProtocol", err)
			}
			if names := dirNames(t, parent); len(names) != 0 {
				t.Errorf("left behind: %v", names)
			}
		})
	}
}

// node is what compareViews compares for one path.
type node struct {
	Type   fs.FileMode
	Mode   fs.FileMode
	UID    uint32
	GID    uint32
	Nlink  uint64 // only in merged views (a layer's whiteouts may share the work dir's inode)
	Size   int64
	MTime  int64
	Rdev   [2]uint32
	Target string
	Data   [32]byte
	Xattrs map[string]string
	Links  []string // other paths of the tree with the same inode
}

// compareViews fails unless the trees at want and got have the same paths
// with the same node descriptions.
func compareViews(t *testing.T, want, got string, merged bool) {
	t.Helper()
	w, g := snapshot(t, want, merged), snapshot(t, got, merged)
	for _, p := range slices.Sorted(maps.Keys(w)) {
		gn, ok := g[p]
		switch {
		case !ok:
			t.Errorf("%s: missing from %s", p, got)
		case !reflect.DeepEqual(w[p], gn):
			t.Errorf("%s differs:\n got  %+v\n want %+v", p, gn, w[p])
		}
	}
	for p := range g {
		if _, ok := w[p]; !ok {
			t.Errorf("%s: unexpected in %s", p, got)
		}
	}
	if len(w) < 10 {
		t.Errorf("only %d entries in %s: the comparison says little", len(w), want)
	}
}

func snapshot(t *testing.T, root string, merged bool) map[string]node {
	t.Helper()
	out := map[string]node{}
	byIno := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{
			Type: fi.Mode().Type(), Mode: fi.Mode() & modeMask, UID: st.Uid, GID: st.Gid,
			MTime: fi.ModTime().UnixNano(), Xattrs: map[string]string{},
		}
		if merged {
			n.Nlink = uint64(st.Nlink)
		}
		n.Rdev[0], n.Rdev[1] = linux.DeviceNumbers(st.Rdev)
		for k, v := range xattrsOf(t, p) {
			n.Xattrs[k] = string(v)
		}
		switch {
		case fi.Mode().IsRegular():
			n.Size = fi.Size()
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Data = sha256.Sum256(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			if n.Target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.IsDir() {
			byIno[st.Ino] = append(byIno[st.Ino], rel)
		}
		out[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, paths := range byIno {
		for _, p := range paths {
			n := out[p]
			n.Links = slices.DeleteFunc(slices.Clone(paths), func(q string) bool { return q == p })
			if len(n.Links) == 0 {
				n.Links = nil
			}
			out[p] = n
		}
	}
	return out
}

func xattrsOf(t *testing.T, p string) map[string][]byte {
	t.Helper()
	x, err := linux.Lxattrs(p, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func statOf(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func isWhiteout(t *testing.T, p string) bool {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	maj, mnr := linux.DeviceNumbers(fi.Sys().(*syscall.Stat_t).Rdev)
	return fi.Mode().Type() == fs.ModeDevice|fs.ModeCharDevice && maj == 0 && mnr == 0
}

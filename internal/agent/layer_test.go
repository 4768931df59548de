package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgehop/edgehop/internal/testutil"
	"github.com/edgehop/edgehop/internal/transfer"
)

// connPair returns both ends of a loopback TCP connection as transfer
// connections.
func connPair(t *testing.T) (*transfer.Conn, *transfer.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	d, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := <-acc
	if a == nil {
		t.Fatal("accept failed")
	}
	s, r := transfer.NewConn(d), transfer.NewConn(a)
	t.Cleanup(func() { s.Close(); r.Close() })
	return s, r
}

// copyLive snapshots src, then copies it to dst over s and r, as the
// live copy of storage pre-copy does, and returns the snapshot.
func copyLive(t *testing.T, s, r *transfer.Conn, src, dst string) layerSnapshot {
	t.Helper()
	before, err := snapshotLayer(src)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := r.RecvDir(context.Background(), dst, transfer.RecvOptions{})
		errc <- err
	}()
	if _, err := s.SendDir(context.Background(), src, transfer.SendOptions{Name: "live", Overlay: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return before
}

func write(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLayerDelta: a layer copied live, then changed in every way a
// service can change files, is made equal on the receiver by the delta,
// and what did not change does not travel again.
func TestLayerDelta(t *testing.T) {
	ctx := context.Background()
	src, dst := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "upper")
	static := make([]byte, 1<<20)
	_, _ = rand.Read(static)
	write(t, filepath.Join(src, "static"), static)
	write(t, filepath.Join(src, "a/f1"), []byte("one"))
	write(t, filepath.Join(src, "a/f2"), []byte("two"))
	write(t, filepath.Join(src, "b/g"), []byte("gone soon"))
	write(t, filepath.Join(src, "d/x/y"), []byte("deep"))
	write(t, filepath.Join(src, "mv"), []byte("renamed"))
	if err := os.Link(filepath.Join(src, "a/f1"), filepath.Join(src, "h")); err != nil {
		t.Fatal(err)
	}
	// Outside the ctime slack, so unchanged entries count as unchanged.
	time.Sleep(time.Duration(ctimeSlack) + 100*time.Millisecond)

	s, r := connPair(t)
	before := copyLive(t, s, r, src, dst)
	errc := make(chan error, 1)

	// Changes after the live copy: same-size rewrite, chmod via a hard
	// link, deletion of a file and of a whole tree, a new file in a new
	// directory, a rename, an opaque directory marker.
	write(t, filepath.Join(src, "a/f2"), []byte("TWO"))
	if err := os.Chmod(filepath.Join(src, "h"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(src, "b/g")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(src, "d")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "c/new"), []byte("new"))
	if err := os.Rename(filepath.Join(src, "mv"), filepath.Join(src, "a/mv")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(src, "a"), "user.edgehop", []byte("y"), 0); err != nil && err != unix.ENOTSUP {
		t.Fatal(err)
	}

	go func() { errc <- recvLayerDelta(ctx, r, dst, 1<<30) }()
	ds, err := sendLayerDelta(ctx, s, src, before, nil, transfer.SendOptions{})
	st, n := ds.st, ds.changed
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st.PayloadBytes >= int64(len(static)) {
		t.Errorf("delta carried %d bytes: the unchanged 1 MiB file went again", st.PayloadBytes)
	}
	t.Logf("delta: %d entries, %d payload bytes", n, st.PayloadBytes)
	sameTree(t, src, dst)
	var s1, s2 unix.Stat_t
	if unix.Stat(filepath.Join(dst, "h"), &s1) != nil || unix.Stat(filepath.Join(dst, "a/f1"), &s2) != nil || s1.Ino != s2.Ino {
		t.Errorf("hard link h = a/f1 not kept")
	}
	if _, err := os.Stat(dst + "-delta"); !os.IsNotExist(err) {
		t.Errorf("receiver left its delta directory: %v", err)
	}
}

// sameTree fails unless b holds exactly a's entries with a's types,
// modes, mtimes (but directories'), contents and extended attributes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	sa, err := snapshotLayer(a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := snapshotLayer(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(sa.entries) != len(sb.entries) {
		t.Errorf("entries: %v vs %v", sa.paths(), sb.paths())
	}
	for p, ea := range sa.entries {
		eb, ok := sb.entries[p]
		if !ok {
			t.Errorf("%s missing", p)
			continue
		}
		if ea.mode != eb.mode || ea.size != eb.size {
			t.Errorf("%s: mode %o size %d, want %o %d", p, eb.mode, eb.size, ea.mode, ea.size)
		}
		if ea.mode&unix.S_IFMT != unix.S_IFDIR && ea.mtime != eb.mtime {
			t.Errorf("%s: mtime %d, want %d", p, eb.mtime, ea.mtime)
		}
		if ea.mode&unix.S_IFMT == unix.S_IFREG {
			da, _ := os.ReadFile(filepath.Join(a, p))
			db, _ := os.ReadFile(filepath.Join(b, p))
			if !bytes.Equal(da, db) {
				t.Errorf("%s: content differs", p)
			}
		}
		xa, xb := make([]byte, 256), make([]byte, 256)
		na, _ := unix.Llistxattr(filepath.Join(a, p), xa)
		nb, _ := unix.Llistxattr(filepath.Join(b, p), xb)
		if !bytes.Equal(xa[:max(na, 0)], xb[:max(nb, 0)]) {
			t.Errorf("%s: xattrs %q, want %q", p, xb[:max(nb, 0)], xa[:max(na, 0)])
		}
	}
}

// TestLayerUnchanged: a live copy and a delta taken right after (within
// the ctime slack, so every entry is sent again) change nothing; each
// kind of change made to the layer meanwhile is seen.
func TestLayerUnchanged(t *testing.T) {
	ctx := context.Background()
	build := func(t *testing.T) string {
		src := filepath.Join(t.TempDir(), "upper")
		write(t, filepath.Join(src, "etc/conf"), []byte("a=1\n"))
		write(t, filepath.Join(src, "data/log"), []byte("line\n"))
		if err := os.Symlink("conf", filepath.Join(src, "etc/link")); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR, 0); err != nil { // an overlay whiteout
			t.Fatal(err)
		}
		return src
	}
	// verdict copies src live, applies change, and says what the delta
	// would change at the receiver.
	verdict := func(t *testing.T, change func(src string)) string {
		src := build(t)
		dst := filepath.Join(t.TempDir(), "upper")
		s, r := connPair(t)
		before := copyLive(t, s, r, src, dst)
		errc := make(chan error, 1)
		change(src)
		var why string
		go func() {
			var ld LayerDelta
			if err := expect(ctx, r, msgLayerDelta, &ld); err != nil {
				errc <- err
				return
			}
			tmp := filepath.Join(t.TempDir(), "delta")
			if _, err := r.RecvDir(ctx, tmp, transfer.RecvOptions{}); err != nil {
				errc <- err
				return
			}
			var err error
			why, err = layerUnchanged(dst, tmp, ld.Keep)
			errc <- err
		}()
		ds, err := sendLayerDelta(ctx, s, src, before, nil, transfer.SendOptions{Overlay: true})
		n := ds.changed
		if err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		t.Logf("%d entries sent again: %q", n, why)
		if n == 0 {
			t.Fatal("nothing sent again: the test does not exercise the comparison")
		}
		return why
	}
	t.Run("nothing", func(t *testing.T) {
		if why := verdict(t, func(string) {}); why != "" {
			t.Fatalf("an unchanged layer: %q", why)
		}
	})
	for name, change := range map[string]func(src string){
		"rewritten": func(src string) { write(t, filepath.Join(src, "etc/conf"), []byte("a=2\n")) },
		"touched": func(src string) {
			future := time.Now().Add(time.Hour)
			if err := os.Chtimes(filepath.Join(src, "data/log"), future, future); err != nil {
				t.Fatal(err)
			}
		},
		"chmod": func(src string) {
			if err := os.Chmod(filepath.Join(src, "etc/conf"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"added": func(src string) { write(t, filepath.Join(src, "data/new"), nil) },
		"removed": func(src string) {
			if err := os.Remove(filepath.Join(src, "data/log")); err != nil {
				t.Fatal(err)
			}
		},
		"relinked": func(src string) {
			p := filepath.Join(src, "etc/link")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("other", p); err != nil {
				t.Fatal(err)
			}
		},
		"xattr": func(src string) {
			if err := unix.Lsetxattr(filepath.Join(src, "etc/conf"), "user.edgehop", []byte("x"), 0); err != nil {
				t.Skipf("skipped: user xattrs here: %v", err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			if why := verdict(t, change); why == "" {
				t.Fatalf("%s: the delta changes nothing, it says", name)
			}
		})
	}
}

// TestApplyInPlace: a delta that only rewrites existing files and
// changes metadata is applied to the same inodes; one that adds, removes
// or replaces an entry is refused with nothing touched.
func TestApplyInPlace(t *testing.T) {
	root, delta := filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "delta")
	write(t, filepath.Join(root, "a/f"), []byte("old"))
	write(t, filepath.Join(root, "a/g"), []byte("same"))
	if err := os.Symlink("f", filepath.Join(root, "a/l")); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "a/f"), &before); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(delta, "a/f"), []byte("new content"))
	if err := os.Chmod(filepath.Join(delta, "a/f"), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1_700_000_000, 0)
	if err := os.Chtimes(filepath.Join(delta, "a/f"), mt, mt); err != nil {
		t.Fatal(err)
	}
	keep := []string{"a", "a/f", "a/g", "a/l"}
	ok, err := applyInPlace(root, delta, keep)
	if err != nil || !ok {
		t.Fatalf("applyInPlace = %v, %v; want applied", ok, err)
	}
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "a/f"), &after); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(root, "a/f"))
	if after.Ino != before.Ino || string(b) != "new content" || after.Mode&0o777 != 0o600 || after.Mtim.Sec != mt.Unix() {
		t.Fatalf("a/f: inode %d (was %d), %q, mode %o, mtime %d", after.Ino, before.Ino, b, after.Mode&0o777, after.Mtim.Sec)
	}
	if why, err := layerUnchanged(root, delta, keep); err != nil || why != "" {
		t.Fatalf("after applying: %q %v", why, err)
	}
	for name, c := range map[string]struct {
		keep  []string
		setup func(delta string)
	}{
		"added":   {append(slices.Clone(keep), "a/new"), func(d string) { write(t, filepath.Join(d, "a/new"), nil) }},
		"removed": {[]string{"a", "a/f", "a/l"}, func(string) {}},
		"relinked": {keep, func(d string) {
			if err := os.Symlink("g", filepath.Join(d, "a/l")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "delta")
			write(t, filepath.Join(d, "a/f"), []byte("other"))
			c.setup(d)
			ok, err := applyInPlace(root, d, c.keep)
			if err != nil || ok {
				t.Fatalf("applyInPlace = %v, %v; want refused", ok, err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "a/f")); string(b) != "new content" {
				t.Fatalf("refused, yet a/f holds %q", b)
			}
		})
	}
}

// layerUnchanged is matchLayer's unchanged, for one comparison.
func layerUnchanged(root, delta string, keep []string) (string, error) {
	m, err := matchLayer(root, delta, keep)
	if err != nil {
		return "", err
	}
	return m.unchanged()
}

// applyInPlace is matchLayer's applyInPlace, for one comparison.
func applyInPlace(root, delta string, keep []string) (bool, error) {
	m, err := matchLayer(root, delta, keep)
	if err != nil {
		return false, err
	}
	return m.applyInPlace()
}

// TestListLayerWhileFilesComeAndGo: a service creating and removing files
// in its layer while it is listed (a database's temporary files) never
// fails the listing; what is listed exists or existed during the walk.
func TestListLayerWhileFilesComeAndGo(t *testing.T) {
	root := t.TempDir()
	for i := range 50 {
		if err := os.MkdirAll(filepath.Join(root, "d", strconv.Itoa(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Churn(t, func(i int) {
		dir := filepath.Join(root, "d", strconv.Itoa(i%50))
		p := filepath.Join(dir, "tmp")
		_ = os.WriteFile(p, nil, 0o644)
		_ = os.Remove(p)
		// Whole directories come and go too.
		_ = os.RemoveAll(dir)
		_ = os.Mkdir(dir, 0o755)
	})
	for range 300 {
		snap, err := listLayer(root)
		if err != nil {
			t.Fatalf("listing a layer whose files come and go: %v", err)
		}
		if _, ok := snap.entries["d"]; !ok {
			t.Fatal("the listing lost a directory that stayed")
		}
	}
}

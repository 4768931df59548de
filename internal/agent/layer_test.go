package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	before, err := snapshotLayer(src)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := r.RecvDir(ctx, dst, transfer.RecvOptions{})
		errc <- err
	}()
	if _, err := s.SendDir(ctx, src, transfer.SendOptions{Name: "live", Overlay: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

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

	go func() { errc <- recvLayerDelta(ctx, r, dst) }()
	st, n, err := sendLayerDelta(ctx, s, src, before, transfer.SendOptions{})
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
	if _, err := os.Stat(dst + "-delta"); !os.IsNotExist(err) {
		t.Errorf("receiver left its delta directory: %v", err)
	}
}

// sameTree fails unless b holds exactly a's entries with a's types,
// modes, contents, extended attributes and hard links.
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
	var s1, s2 unix.Stat_t
	if unix.Stat(filepath.Join(b, "h"), &s1) != nil || unix.Stat(filepath.Join(b, "a/f1"), &s2) != nil || s1.Ino != s2.Ino {
		t.Errorf("hard link h = a/f1 not kept")
	}
}

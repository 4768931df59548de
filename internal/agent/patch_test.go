package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/blockdiff"
	"github.com/edgehop/edgehop/internal/transfer"
)

// patchLayer builds a layer with large files, copies it live with their
// blocks recorded, changes it, and returns the source, the receiver's
// copy, the snapshot and the recorded blocks.
func patchLayer(t *testing.T, s, r *transfer.Conn) (src, dst string, before layerSnapshot, sums *blockdiff.Index) {
	t.Helper()
	src, dst = filepath.Join(t.TempDir(), "upper"), filepath.Join(t.TempDir(), "upper")
	for _, name := range []string{"db/redo", "db/table", "db/rewritten", "db/same"} {
		b := make([]byte, 3<<20+1234)
		_, _ = rand.Read(b)
		write(t, filepath.Join(src, name), b)
	}
	write(t, filepath.Join(src, "etc/conf"), []byte("a=1\n"))
	time.Sleep(time.Duration(ctimeSlack) + 100*time.Millisecond)
	before, err := snapshotLayer(src)
	if err != nil {
		t.Fatal(err)
	}
	sums = blockdiff.NewIndex()
	errc := make(chan error, 1)
	go func() {
		_, err := r.RecvDir(context.Background(), dst, transfer.RecvOptions{})
		errc <- err
	}()
	if _, err := s.SendDir(context.Background(), src, transfer.SendOptions{Name: "live", Overlay: true, Tee: teeSums(sums)}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// A few bytes in the middle of one file, the end of another cut and
	// a tail appended, a third rewritten whole, a fourth touched only, a
	// small file changed.
	patchFile(t, filepath.Join(src, "db/redo"), 1<<20+17, []byte("committed"))
	f, err := os.OpenFile(filepath.Join(src, "db/table"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2<<20 + 5); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 100<<10), 2<<20+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	whole := make([]byte, 3<<20)
	_, _ = rand.Read(whole)
	write(t, filepath.Join(src, "db/rewritten"), whole)
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(src, "db/same"), future, future); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "db/same"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "etc/conf"), []byte("a=2\n"))
	return src, dst, before, sums
}

func patchFile(t *testing.T, p string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestLayerDeltaPatches: large files that changed in part cross as their
// changed blocks, and the receiver ends with the source's layer, whether
// it applies the delta in place (a restore at its gate holds the layer)
// or by replacing entries.
func TestLayerDeltaPatches(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		name := map[bool]string{false: "replaced", true: "in-place"}[inPlace]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, r := connPair(t)
			src, dst, before, sums := patchLayer(t, s, r)
			errc := make(chan error, 1)
			var patched []blockdiff.Patch
			// inPlaceRecv is receiveLayerDelta's in-place path.
			inPlaceRecv := func() error {
				rd, err := recvDelta(ctx, r, dst, 1<<30)
				defer rd.remove()
				if err != nil {
					return err
				}
				patched = rd.Patched
				m, err := rd.match(dst)
				if err != nil {
					return err
				}
				if why, err := m.unchanged(); err != nil || why == "" {
					t.Errorf("a patched layer counted unchanged: %q %v", why, err)
				}
				ok, err := m.applyInPlace()
				if err == nil && !ok {
					t.Error("a patched layer not applied in place")
				}
				return err
			}
			go func() {
				if inPlace {
					errc <- inPlaceRecv()
				} else {
					errc <- recvLayerDelta(ctx, r, dst, 1<<30)
				}
			}()
			ds, err := sendLayerDelta(ctx, s, src, before, sums, transfer.SendOptions{Overlay: true})
			st, n := ds.st, ds.changed
			if err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			sameTree(t, src, dst)
			// redo: one block; table: its cut block and the tail; same:
			// none; rewritten goes whole (3 MiB).
			if max := int64(3<<20 + 400<<10); st.PayloadBytes > max {
				t.Errorf("delta carried %d bytes, want at most %d: the patched files went whole", st.PayloadBytes, max)
			}
			t.Logf("%d entries changed, %d payload bytes", n, st.PayloadBytes)
			if ds.patched != 3 || ds.patchBytes != blockdiff.BlockSize+100<<10+5 {
				t.Errorf("%d files patched with %d bytes, want 3 with %d", ds.patched, ds.patchBytes, blockdiff.BlockSize+100<<10+5)
			}
			if inPlace {
				got := map[string]int64{}
				for _, p := range patched {
					got[p.Path] = p.DataLen()
				}
				// redo: the block written; table: from its cut block's
				// start to its new end; same: nothing but metadata.
				want := map[string]int64{"db/redo": blockdiff.BlockSize, "db/table": 100<<10 + 5, "db/same": 0}
				for p, n := range want {
					if g, ok := got[p]; !ok || g != n {
						t.Errorf("%s: patch of %d bytes (patched: %v), want %d", p, g, ok, n)
					}
				}
				if _, ok := got["db/rewritten"]; ok {
					t.Error("a file changed whole went as a patch")
				}
			}
			for _, p := range []string{dst + "-delta", dst + "-delta-blocks"} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("receiver left %s: %v", p, err)
				}
			}
		})
	}
}

// TestLayerPatchRefused: a patch the receiver cannot apply fails the
// delta, naming the file, and writes nothing through a link.
func TestLayerPatchRefused(t *testing.T) {
	ctx := context.Background()
	s, r := connPair(t)
	src, dst, before, sums := patchLayer(t, s, r)
	// The receiver's copy is not what the source sent.
	if err := os.Remove(filepath.Join(dst, "db/redo")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dst, "db/redo")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- recvLayerDelta(ctx, r, dst, 1<<30) }()
	if _, err := sendLayerDelta(ctx, s, src, before, sums, transfer.SendOptions{Overlay: true}); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if err == nil {
		t.Fatal("a patch onto a symbolic link was applied")
	}
	t.Log(err)
	if !bytes.Contains([]byte(err.Error()), []byte("db/redo")) {
		t.Errorf("error does not name the file: %v", err)
	}
	if _, err := os.Stat(dst + "-delta"); !os.IsNotExist(err) {
		t.Errorf("receiver left its delta directory: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "db/redo")); err != nil || target != "/etc/passwd" {
		t.Errorf("the receiver's entry changed: %q %v", target, err)
	}
}

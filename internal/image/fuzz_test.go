package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func tarOf(f *testing.F, entries ...tar.Header) []byte {
	f.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := []byte(nil)
		if h.Typeflag == tar.TypeReg {
			body = bytes.Repeat([]byte("x"), int(h.Size))
		}
		if err := tw.WriteHeader(&h); err != nil {
			f.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			f.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzUnpack unpacks an arbitrary layer: whatever it holds ("..", absolute
// names, symlinks pointing out, hardlinks to outside), nothing is created
// or changed outside the destination.
func FuzzUnpack(f *testing.F) {
	now := time.Unix(1700000000, 0)
	f.Add(tarOf(f,
		tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now},
		tar.Header{Name: "etc/hosts", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10, ModTime: now},
		tar.Header{Name: "bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin", ModTime: now},
		tar.Header{Name: "etc/hosts2", Typeflag: tar.TypeLink, Linkname: "etc/hosts", ModTime: now},
	))
	f.Add(tarOf(f,
		tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "../outside", ModTime: now},
		tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, ModTime: now},
	))
	f.Add(tarOf(f, tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, ModTime: now}))
	f.Add(tarOf(f, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd", ModTime: now}))
	f.Fuzz(func(t *testing.T, in []byte) {
		base := t.TempDir()
		dest := filepath.Join(base, "rootfs")
		outside := filepath.Join(base, "outside")
		if err := os.MkdirAll(dest, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dest)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		u := unpacker{root: root}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = u.run(ctx, tar.NewReader(bytes.NewReader(in)))
		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2 {
			t.Fatalf("unpack created %d entries beside the destination", len(ents)-2)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("unpack wrote %s outside the destination", ents[0].Name())
		}
	})
}

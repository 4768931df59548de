package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// oddTree builds the tree the round-trip tests send: empty and tiny files,
// a file larger than several chunks with holes and data at unaligned
// offsets, compressible and random files, symlinks (relative, absolute,
// dangling), nested and empty directories, a read-only directory and
// unusual modes.
func oddTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "empty"), nil, 0o644)
	writeFile(t, filepath.Join(src, "tiny"), []byte("x"), 0o600)
	writeFile(t, filepath.Join(src, "exec.sh"), []byte("#!/bin/sh\necho hi\n"), 0o751)
	writeFile(t, filepath.Join(src, "pages-1.img"), compressible(3<<20+123, 1), 0o644)
	writeFile(t, filepath.Join(src, "random.bin"), randomBytes(2<<20+7, 2), 0o644)

	// Sparse-ish: 5 MiB of zeros with data in the middle of a chunk and at
	// the end, written as a real sparse file.
	sparse := filepath.Join(src, "a", "b", "c", "sparse.img")
	writeFile(t, sparse, nil, 0o640)
	f, err := os.OpenFile(sparse, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{1<<20 + 4097, 5<<20 - 10} {
		if _, err := f.WriteAt(randomBytes(10, uint64(off)), off); err != nil {
			t.Fatal(err)
		}
	}
	// A trailing hole: the size goes past the last data.
	if err := f.Truncate(6 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if err := os.MkdirAll(filepath.Join(src, "empty-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "ro", "inside"), []byte("read-only parent"), 0o444)
	if err := os.Chmod(filepath.Join(src, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"link-rel":      "a/b/c/sparse.img",
		"link-abs":      "/etc/hostname",
		"a/link-dangle": "../nowhere",
		"a/link-up":     "..",
	} {
		if err := os.Symlink(target, filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The sticky bit survives too.
	if err := os.Mkdir(filepath.Join(src, "sticky"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src, "sticky"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	// Owners other than the test's (applied when the receiver is root) and
	// old modification times, on a file, a directory and a symlink.
	if os.Geteuid() == 0 {
		for _, p := range []string{"exec.sh", "a/b", "link-rel"} {
			if err := os.Lchown(filepath.Join(src, p), 1234, 5678); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Join(src, "exec.sh"), 0o751|os.ModeSetuid); err != nil { // setuid survives chown order
			t.Fatal(err)
		}
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, p := range []string{"tiny", "a/b", "a"} {
		if err := os.Chtimes(filepath.Join(src, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "ro"), 0o755) })
	return src
}

func TestRoundTripTree(t *testing.T) {
	src := oddTree(t)
	tests := []struct {
		name       string
		opts       SendOptions
		compressed bool
		autoOff    bool // auto must decide against compression
	}{
		{"off", SendOptions{Compression: CompressOff}, false, false},
		{"zstd", SendOptions{Compression: CompressZstd}, true, false},
		// A slow declared link makes compressing 3x-compressible pages pay.
		{"auto slow link", SendOptions{Compression: CompressAuto, LinkBitsPerSecond: 10_000_000}, true, false},
		// No CPU compresses faster than 10 Tbit/s: auto must stay off.
		// Probe chunks still go compressed when smaller (the work is done).
		{"auto fast link", SendOptions{Compression: CompressAuto, LinkBitsPerSecond: 10_000_000_000_000}, false, true},
		{"small chunks", SendOptions{Compression: CompressZstd, ChunkSize: 4096, Depth: 1}, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out", "dst")
			tc.opts.Name = "images"
			send, recv := transferDir(t, src, dst, tc.opts, RecvOptions{}, nil)
			if send.err != nil || recv.err != nil {
				t.Fatalf("send: %v; recv: %v", send.err, recv.err)
			}
			compareTrees(t, src, dst)

			s, r := send.st, recv.st
			if r.Name != "images" || r.Compression != tc.opts.Compression {
				t.Errorf("receiver saw name %q compression %v", r.Name, r.Compression)
			}
			if s.Files != 7 || s.Dirs != 7 || s.Symlinks != 4 {
				t.Errorf("sender counted %d files, %d dirs, %d symlinks; want 7, 7, 4", s.Files, s.Dirs, s.Symlinks)
			}
			for _, f := range []struct {
				name string
				a, b int64
			}{
				{"files", s.Files, r.Files}, {"dirs", s.Dirs, r.Dirs}, {"symlinks", s.Symlinks, r.Symlinks},
				{"payload", s.PayloadBytes, r.PayloadBytes}, {"wire", s.WireBytes, r.WireBytes},
				{"chunks", s.Chunks, r.Chunks}, {"compressed", s.CompressedChunks, r.CompressedChunks},
				{"zero", s.ZeroChunks, r.ZeroChunks},
			} {
				if f.a != f.b {
					t.Errorf("%s: sender %d, receiver %d", f.name, f.a, f.b)
				}
			}
			if s.Digest != r.Digest || s.Digest == 0 {
				t.Errorf("digest: sender %x, receiver %x", s.Digest, r.Digest)
			}
			const payload = 3<<20 + 123 + 2<<20 + 7 + 6<<20 + 1 + 18 + 16
			if s.PayloadBytes != payload {
				t.Errorf("payload %d bytes, want %d", s.PayloadBytes, payload)
			}
			if s.Compressed != r.Compressed {
				t.Errorf("compressed: sender %v, receiver %v", s.Compressed, r.Compressed)
			}
			if tc.autoOff {
				probes := 1 + s.Chunks/(autoReprobe+1)
				if !strings.HasPrefix(s.AutoNote, "zstd off") || s.CompressedChunks > probes {
					t.Errorf("auto: %d of %d chunks compressed (at most %d probes), note %q", s.CompressedChunks, s.Chunks, probes, s.AutoNote)
				}
			} else if s.Compressed != tc.compressed {
				t.Errorf("compressed: sender %v, receiver %v, want %v (%s)", s.Compressed, r.Compressed, tc.compressed, s.AutoNote)
			}
			if tc.compressed && s.WireBytes >= s.PayloadBytes*3/4 {
				t.Errorf("compression on but %d wire bytes for %d payload", s.WireBytes, s.PayloadBytes)
			}
			if s.ZeroChunks == 0 && tc.opts.ChunkSize == 0 {
				t.Errorf("the sparse file's empty chunks went as data")
			}
			if tc.opts.Compression == CompressAuto && s.AutoNote == "" {
				t.Errorf("auto mode left no note")
			}
			t.Logf("sender: %v [%s]; receiver: %v", s, s.AutoNote, r)
		})
	}
}

func TestAutoDecision(t *testing.T) {
	const MB = 1e6
	tests := []struct {
		speed, ratio, link float64
		want               bool
	}{
		{speed: 500 * MB, ratio: 3, link: 125 * MB, want: true},     // 1 Gbit/s, good ratio
		{speed: 500 * MB, ratio: 1.05, link: 125 * MB, want: false}, // incompressible
		{speed: 100 * MB, ratio: 3, link: 125 * MB, want: false},    // CPU slower than link
		{speed: 500 * MB, ratio: 3, link: 1250 * MB, want: false},   // 10 Gbit/s
		{speed: 300 * MB, ratio: 1.5, link: 12.5 * MB, want: true},  // 100 Mbit/s
		{speed: 0, ratio: 3, link: 125 * MB, want: false},
	}
	for _, tc := range tests {
		if got := worthCompressing(tc.speed, tc.ratio, tc.link); got != tc.want {
			t.Errorf("worthCompressing(speed %.0f MB/s, ratio %.2f, link %.0f MB/s) = %v, want %v",
				tc.speed/MB, tc.ratio, tc.link/MB, got, tc.want)
		}
	}

	// Over a stream: random data on a slow link is probed, found not worth
	// it, and sent raw, re-probing every autoReprobe chunks.
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx := context.Background()
	data := randomBytes(40<<20/8, 9) // 5 MiB
	done := make(chan result, 1)
	go func() {
		st, err := sc.SendStream(ctx, bytes.NewReader(data), SendOptions{Compression: CompressAuto, LinkBitsPerSecond: 10_000_000, ChunkSize: 64 << 10})
		done <- result{st, err}
	}()
	var got bytes.Buffer
	if _, err := rc.RecvStream(ctx, &got, RecvOptions{}); err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s.err != nil {
		t.Fatal(s.err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatal("content differs")
	}
	if s.st.Compressed || !strings.Contains(s.st.AutoNote, "zstd off") {
		t.Fatalf("random data: compressed=%v, note %q", s.st.Compressed, s.st.AutoNote)
	}
}

func TestCorruptionDetected(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "pages.img"), compressible(4<<20, 3), 0o644)
	tests := []struct {
		name   string
		opts   SendOptions
		flipAt int64
	}{
		{"first header", SendOptions{}, 3},
		{"raw data mid-stream", SendOptions{}, 2 << 20},
		{"compressed data", SendOptions{Compression: CompressZstd}, 500 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			_, recv := transferDir(t, src, dst, tc.opts, RecvOptions{}, func(c net.Conn) net.Conn {
				return &faultConn{Conn: c, flipAt: tc.flipAt, closeAt: -1}
			})
			if !errors.Is(recv.err, ErrCorrupt) {
				t.Fatalf("recv error %v, want ErrCorrupt", recv.err)
			}
			if names := dirNames(t, parent); len(names) != 0 {
				t.Fatalf("left behind: %v", names)
			}
			t.Logf("recv: %v", recv.err)
		})
	}
}

func TestTruncationDetected(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "a"), randomBytes(3<<20, 4), 0o644)
	writeFile(t, filepath.Join(src, "b"), []byte("second file"), 0o644)
	for _, cut := range []int64{0, 10, 1 << 20, 3<<20 + 100} {
		t.Run("", func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			send, recv := transferDir(t, src, dst, SendOptions{}, RecvOptions{}, func(c net.Conn) net.Conn {
				return &faultConn{Conn: c, flipAt: -1, closeAt: cut}
			})
			if !errors.Is(recv.err, ErrTruncated) {
				t.Fatalf("cut at %d: recv error %v, want ErrTruncated", cut, recv.err)
			}
			if send.err == nil {
				t.Errorf("sender reported success on a closed connection")
			}
			if names := dirNames(t, parent); len(names) != 0 {
				t.Fatalf("left behind: %v", names)
			}
		})
	}
}

// rawStream writes a hand-made directory stream, as a hostile or broken
// sender would.
func rawStream(t *testing.T, w io.Writer, entries []entry, data map[string][]byte) {
	t.Helper()
	frame := func(k kind, flags uint8, payload []byte, rawLen int) {
		b := make([]byte, headerLen+len(payload))
		copy(b[headerLen:], payload)
		putHeader(b, k, flags, payload, rawLen)
		if _, err := w.Write(b); err != nil {
			t.Logf("raw write: %v", err) // the receiver may have hung up
		}
	}
	hp, _ := json.Marshal(streamHeader{Kind: streamDir, Compression: "off"})
	frame(kindBegin, 0, hp, len(hp))
	for _, e := range entries {
		p, _ := json.Marshal(e)
		frame(kindEntry, 0, p, len(p))
		if d := data[e.Path]; d != nil {
			frame(kindData, 0, d, len(d))
		}
	}
	frame(kindEnd, 0, []byte(`{}`), 2)
}

func TestUnsafePathsRejected(t *testing.T) {
	outside := t.TempDir() // a symlink in the stream points here
	root := entry{Path: ".", Type: entryDir, Mode: 0o755}
	file := func(p string) entry { return entry{Path: p, Type: entryFile, Mode: 0o644} }
	tests := []struct {
		name    string
		entries []entry
	}{
		{"parent", []entry{root, file("../x")}},
		{"deep parent", []entry{root, {Path: "a", Type: entryDir, Mode: 0o755}, file("a/../../x")}},
		{"absolute", []entry{root, file("/tmp/x")}},
		{"not clean", []entry{root, file("./x")}},
		{"through symlink", []entry{root, {Path: "l", Type: entrySymlink, Target: outside}, file("l/x")}},
		{"under a file", []entry{root, file("f"), file("f/x")}},
		{"parent not sent", []entry{root, file("missing/x")}},
		{"hard link leaving", []entry{root, {Path: "h", Type: entryHardlink, Target: "../x"}}},
		{"hard link absolute", []entry{root, {Path: "h", Type: entryHardlink, Target: "/etc/hostname"}}},
		{"hard link to dir", []entry{root, {Path: "a", Type: entryDir, Mode: 0o755}, {Path: "h", Type: entryHardlink, Target: "a"}}},
		{"hard link to root", []entry{root, {Path: "h", Type: entryHardlink, Target: "."}}},
		{"hard link not sent", []entry{root, {Path: "h", Type: entryHardlink, Target: "later"}, file("later")}},
		{"hard link through symlink", []entry{root, {Path: "l", Type: entrySymlink, Target: outside}, {Path: "h", Type: entryHardlink, Target: "l/x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			parent := t.TempDir()
			go rawStream(t, a, tc.entries, map[string][]byte{"../x": []byte("pwned"), "l/x": []byte("pwned")})
			_, err := NewConn(b).RecvDir(context.Background(), filepath.Join(parent, "dst"), RecvOptions{})
			if !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("got %v, want ErrUnsafePath", err)
			}
			if names := dirNames(t, parent); len(names) != 0 {
				t.Errorf("left behind: %v", names)
			}
			if names := dirNames(t, outside); len(names) != 0 {
				t.Errorf("wrote outside the tree: %v", names)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(parent), "x")); err == nil {
				t.Errorf("wrote ../x")
			}
		})
	}
}

func TestMessagesAndStreamsInterleave(t *testing.T) {
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx := context.Background()
	type prepare struct {
		Container string `json:"container"`
		Pages     int    `json:"pages"`
	}
	payload := compressible(3<<20+5, 7)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "core.img"), payload, 0o600)

	errc := make(chan error, 1)
	go func() {
		errc <- func() error {
			if err := sc.WriteMsg(ctx, "prepare", prepare{"redis", 42}); err != nil {
				return err
			}
			if _, err := sc.SendDir(ctx, src, SendOptions{Compression: CompressZstd}); err != nil {
				return err
			}
			if _, err := sc.SendStream(ctx, &slowReader{data: payload, piece: 100 << 10, pause: time.Millisecond}, SendOptions{Name: "pages"}); err != nil {
				return err
			}
			return sc.WriteMsg(ctx, "done", nil)
		}()
	}()

	typ, body, err := rc.ReadMsg(ctx)
	if err != nil || typ != "prepare" {
		t.Fatalf("ReadMsg = %q, %v", typ, err)
	}
	var p prepare
	if err := json.Unmarshal(body, &p); err != nil || p != (prepare{"redis", 42}) {
		t.Fatalf("body %s: %v", body, err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if _, err := rc.RecvDir(ctx, dst, RecvOptions{}); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst)
	var got bytes.Buffer
	st, err := rc.RecvStream(ctx, &got, RecvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), payload) || st.Name != "pages" {
		t.Fatalf("stream %q: %d bytes, equal=%v", st.Name, got.Len(), bytes.Equal(got.Bytes(), payload))
	}
	// Pieces of 100 KiB from a slow reader go out as they come, not in
	// 1 MiB chunks.
	if st.Chunks < 20 {
		t.Errorf("slow reader sent in %d chunks, want one per piece", st.Chunks)
	}
	if typ, body, err := rc.ReadMsg(ctx); err != nil || typ != "done" || body != nil {
		t.Fatalf("ReadMsg = %q, %s, %v", typ, body, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	// Out of order: a stream where a message is expected.
	sent := make(chan error, 1)
	go func() {
		_, err := sc.SendStream(ctx, strings.NewReader("x"), SendOptions{})
		sent <- err
	}()
	defer func() { <-sent }()
	if _, _, err := rc.ReadMsg(ctx); !errors.Is(err, ErrProtocol) {
		t.Fatalf("ReadMsg on a stream: %v, want ErrProtocol", err)
	}
	if _, _, err := rc.ReadMsg(ctx); !errors.Is(err, ErrBroken) {
		t.Fatalf("ReadMsg after a protocol error: %v, want ErrBroken", err)
	}
	// Clean close between messages is io.EOF, not truncation.
	c, d := tcpPair(t)
	c.Close()
	if _, _, err := NewConn(d).ReadMsg(ctx); !errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated) {
		t.Fatalf("ReadMsg after close: %v, want io.EOF", err)
	}
}

// TestStreamIsIncremental shows that a stream's data reaches the receiver
// while the sender's reader is still producing: the reader blocks until
// the receiver has seen the first bytes.
func TestStreamIsIncremental(t *testing.T) {
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	seen := make(chan struct{})
	first := randomBytes(200<<10, 5)
	second := randomBytes(300<<10, 6)
	go func() {
		pw.Write(first)
		select {
		case <-seen:
			pw.Write(second)
			pw.Close()
		case <-ctx.Done():
			pw.CloseWithError(ctx.Err())
		}
	}()
	done := make(chan result, 1)
	go func() {
		st, err := sc.SendStream(ctx, pr, SendOptions{})
		done <- result{st, err}
	}()
	w := &notifyWriter{seen: seen}
	if _, err := rc.RecvStream(ctx, w, RecvOptions{}); err != nil {
		t.Fatalf("recv: %v (data was held back until the end?)", err)
	}
	if s := <-done; s.err != nil {
		t.Fatal(s.err)
	}
	if !bytes.Equal(w.buf.Bytes(), append(first, second...)) {
		t.Fatal("content differs")
	}
}

type notifyWriter struct {
	buf  bytes.Buffer
	seen chan struct{}
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	if w.buf.Len() == 0 {
		close(w.seen)
	}
	return w.buf.Write(p)
}

func TestSendFileRecvFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "pages.img")
	data := append(compressible(1<<20, 8), make([]byte, 3<<20)...) // trailing hole
	writeFile(t, src, data, 0o640)
	for _, comp := range []Compression{CompressOff, CompressZstd, CompressAuto} {
		t.Run(comp.String(), func(t *testing.T) {
			a, b := tcpPair(t)
			sc, rc := NewConn(a), NewConn(b)
			ctx := context.Background()
			done := make(chan result, 1)
			go func() {
				st, err := sc.SendFile(ctx, src, SendOptions{Compression: comp})
				done <- result{st, err}
			}()
			dst := filepath.Join(t.TempDir(), "got.img")
			st, err := rc.RecvFile(ctx, dst, RecvOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if s := <-done; s.err != nil || s.st.Digest != st.Digest {
				t.Fatalf("send: %v, digest %x vs %x", s.err, s.st.Digest, st.Digest)
			}
			got, err := os.ReadFile(dst)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("content differs (%d bytes, %v)", len(got), err)
			}
			fi, _ := os.Stat(dst)
			if fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v, want 0640", fi.Mode().Perm())
			}
			if st.ZeroChunks != 3 {
				t.Errorf("%d zero chunks, want 3", st.ZeroChunks)
			}
			// The trailing 3 MiB of zeros is a hole, not written blocks.
			if sys, ok := fi.Sys().(*syscall.Stat_t); ok && sys.Blocks*512 > 2<<20 {
				t.Errorf("%d bytes allocated for 1 MiB of data", sys.Blocks*512)
			}
		})
	}
}

func TestAbortKeepsConnectionUsable(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "a.img"), randomBytes(100<<10, 1), 0o644)
	// A FIFO is not something a checkpoint contains: the sender refuses it.
	if err := syscall.Mkfifo(filepath.Join(src, "z-fifo"), 0o644); err != nil {
		t.Skipf("skipped: cannot make a FIFO here: %v", err)
	}
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, err := sc.SendDir(ctx, src, SendOptions{})
		if err == nil {
			errc <- errors.New("SendDir accepted a FIFO")
			return
		}
		errc <- sc.WriteMsg(ctx, "after", nil)
	}()
	parent := t.TempDir()
	_, err := rc.RecvDir(ctx, filepath.Join(parent, "dst"), RecvOptions{})
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "unsupported file type") {
		t.Fatalf("recv: %v, want ErrAborted naming the FIFO", err)
	}
	if names := dirNames(t, parent); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
	if typ, _, err := rc.ReadMsg(ctx); err != nil || typ != "after" {
		t.Fatalf("message after abort: %q, %v", typ, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestMaxBytes(t *testing.T) {
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := sc.SendStream(ctx, bytes.NewReader(randomBytes(3<<20, 1)), SendOptions{})
		done <- err
	}()
	_, err := rc.RecvStream(ctx, io.Discard, RecvOptions{MaxBytes: 2 << 20})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	rc.Close()
	<-done // fails or not, depending on how much fit in the socket buffers
}

// endless yields non-zero data forever.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i | 1)
	}
	return len(p), nil
}

func TestCancellationIsPrompt(t *testing.T) {
	const bound = 2 * time.Second
	t.Run("sender blocked on a peer that stopped reading", func(t *testing.T) {
		a, _ := tcpPair(t) // nobody reads the other end
		sc := NewConn(a)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		_, err := sc.SendStream(ctx, endless{}, SendOptions{})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 300*time.Millisecond+bound {
			t.Fatalf("returned after %v", d)
		}
		if err := sc.WriteMsg(context.Background(), "x", nil); err == nil {
			t.Fatal("connection still usable after cancellation")
		}
	})
	t.Run("receiver waiting on a silent peer", func(t *testing.T) {
		a, b := tcpPair(t)
		rc := NewConn(b)
		// The sender starts a stream and goes silent mid-file, keeping the
		// connection open.
		var stream bytes.Buffer
		f := entry{Path: "f", Type: entryFile, Mode: 0o644}
		rawStream(t, &stream, []entry{{Path: ".", Type: entryDir, Mode: 0o755}, f}, map[string][]byte{"f": randomBytes(4096, 1)})
		if _, err := a.Write(stream.Bytes()[:stream.Len()-100]); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		parent := t.TempDir()
		start := time.Now()
		_, err := rc.RecvDir(ctx, filepath.Join(parent, "dst"), RecvOptions{})
		if err == nil {
			t.Fatal("RecvDir succeeded")
		}
		if d := time.Since(start); d > 300*time.Millisecond+bound {
			t.Fatalf("returned after %v", d)
		}
		if names := dirNames(t, parent); len(names) != 0 {
			t.Fatalf("left behind: %v", names)
		}
	})
	t.Run("receiver waiting for a stream that never comes", func(t *testing.T) {
		_, b := tcpPair(t)
		rc := NewConn(b)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := rc.RecvStream(ctx, io.Discard, RecvOptions{})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 300*time.Millisecond+bound {
			t.Fatalf("returned after %v", d)
		}
	})
}

func TestDirExistsRefused(t *testing.T) {
	dst := t.TempDir()
	_, b := tcpPair(t)
	_, err := NewConn(b).RecvDir(context.Background(), dst, RecvOptions{})
	if !errors.Is(err, os.ErrExist) {
		t.Fatalf("got %v, want ErrExist", err)
	}
}

func TestOptionsValidated(t *testing.T) {
	a, _ := tcpPair(t)
	c := NewConn(a)
	for _, o := range []SendOptions{{ChunkSize: 100}, {ChunkSize: MaxChunkSize + 1}, {Depth: -1}, {Compression: 7}, {LinkBitsPerSecond: -1}} {
		if _, err := c.SendStream(context.Background(), strings.NewReader("x"), o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
	for _, s := range []string{"off", "zstd", "auto"} {
		if c, err := ParseCompression(s); err != nil || c.String() != s {
			t.Errorf("ParseCompression(%q) = %v, %v", s, c, err)
		}
	}
}

func TestHeaderBounds(t *testing.T) {
	valid := func(k kind, flags uint8, payload []byte, raw int) []byte {
		b := make([]byte, headerLen)
		putHeader(b, k, flags, payload, raw)
		return b
	}
	// Headers with a correct CRC but impossible fields are refused before
	// any payload is read or allocated.
	tests := map[string][]byte{
		"unknown kind":           valid(9, 0, nil, 0),
		"control with flags":     valid(kindMsg, flagZstd, nil, 0),
		"zero with payload":      valid(kindData, flagZero, []byte("x"), 1),
		"too large chunk":        valid(kindData, 0, nil, MaxChunkSize+1),
		"compressed not smaller": valid(kindData, flagZstd, make([]byte, 10), 10),
		"both flags":             valid(kindData, flagZstd|flagZero, nil, 10),
	}
	for name, h := range tests {
		if _, err := parseHeader(h); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	ok := valid(kindData, 0, make([]byte, 10), 10)
	if _, err := parseHeader(ok); err != nil {
		t.Errorf("valid header refused: %v", err)
	}
}

// A probe timed in a busy moment does not turn compression off when the
// warm-up measured this CPU faster; the ratio still decides.
func TestAutoSpeedFloor(t *testing.T) {
	const MB = 1e6
	a := autoState{link: 125 * MB, floor: 600 * MB}
	a.observe(1<<20, (1<<20)/5, 20*time.Millisecond) // 52 MB/s seen, ratio 5
	if !a.on {
		t.Fatalf("with a 600 MB/s floor, ratio 5 on 1 Gbit/s: compression off (%s)", a.String())
	}
	b := autoState{link: 125 * MB, floor: 600 * MB}
	b.observe(1<<20, 1<<20, time.Millisecond) // incompressible
	if b.on {
		t.Fatalf("incompressible data: compression on (%s)", b.String())
	}
	c := autoState{link: 125 * MB}
	c.observe(1<<20, (1<<20)/5, 20*time.Millisecond)
	if c.on {
		t.Fatalf("no floor, 52 MB/s measured: compression on (%s)", c.String())
	}
}

func TestWarmCompressionMeasures(t *testing.T) {
	a, _ := tcpPair(t)
	c := NewConn(a)
	if err := c.WarmCompression(); err != nil {
		t.Fatal(err)
	}
	if c.encSpeed <= 0 {
		t.Fatalf("encSpeed = %v after WarmCompression", c.encSpeed)
	}
}

// TestMsgInsteadOfStream: a peer that gives up in the middle sends a
// message where a stream was awaited; the receiver gets it as a
// MsgInsteadError (an ErrProtocol) carrying the message.
func TestMsgInsteadOfStream(t *testing.T) {
	ctx := context.Background()
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	defer sc.Close()
	defer rc.Close()
	type reason struct {
		Reason string `json:"reason"`
	}
	go func() { _ = sc.WriteMsg(ctx, "abort", reason{"disk full"}) }()
	_, err := rc.RecvDir(ctx, filepath.Join(t.TempDir(), "in"), RecvOptions{})
	var mi *MsgInsteadError
	if !errors.As(err, &mi) || !errors.Is(err, ErrProtocol) {
		t.Fatalf("RecvDir on a message: %v, want a MsgInsteadError", err)
	}
	var r reason
	if mi.Type != "abort" || json.Unmarshal(mi.Body, &r) != nil || r.Reason != "disk full" {
		t.Fatalf("message %q %s", mi.Type, mi.Body)
	}
}

// TestTee: SendOptions.Tee sees each regular file's bytes exactly as sent,
// and only regular files.
func TestTee(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "out")
	files := map[string][]byte{"a": randomBytes(3<<20+5, 1), "d/b": []byte("small"), "d/empty": nil}
	for name, b := range files {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	if err := os.Symlink("a", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	seen := map[string]*bytes.Buffer{}
	tee := func(rel string, fi fs.FileInfo) io.Writer {
		if !fi.Mode().IsRegular() {
			t.Errorf("tee called for %s (%v)", rel, fi.Mode())
		}
		b := &bytes.Buffer{}
		seen[rel] = b
		return b
	}
	so := SendOptions{Compression: CompressZstd, ChunkSize: 64 << 10, Tee: tee}
	if send, recv := transferDir(t, src, dst, so, RecvOptions{}, nil); send.err != nil || recv.err != nil {
		t.Fatalf("send %v, receive %v", send.err, recv.err)
	}
	compareTrees(t, src, dst)
	if len(seen) != len(files) {
		t.Errorf("tee saw %d files, want %d", len(seen), len(files))
	}
	for name, b := range files {
		if got := seen[name]; got == nil || !bytes.Equal(got.Bytes(), b) {
			t.Errorf("%s: tee saw other bytes than the file's", name)
		}
	}
}

// TestDenseOnSlowLink: a stream over a link far slower than the fast
// encoder (as WarmCompression measured it) goes through the dense one,
// which makes compressible data smaller; a 1 Gbit/s link, with the fast
// encoder's speed measured on this machine, keeps the fast one. Both
// arrive intact.
func TestDenseOnSlowLink(t *testing.T) {
	ctx := context.Background()
	// Text of words from a small vocabulary: zstd's default level finds
	// more of its repeats than its fastest.
	vocab := strings.Fields("page heap arena slot request worker session opcache zval string array object handler query result cache entry table index")
	var text bytes.Buffer
	r := rand.New(rand.NewPCG(7, 7))
	for text.Len() < 8<<20 {
		text.WriteString(vocab[r.IntN(len(vocab))])
		text.WriteByte(" \n"[r.IntN(2)])
	}
	data := text.Bytes()
	send := func(bps int64) (Stats, *Conn) {
		t.Helper()
		a, b := tcpPair(t)
		sc, rc := NewConn(a), NewConn(b)
		defer sc.Close()
		defer rc.Close()
		sc.encSpeed = 2.6e9 // WarmCompression's measure here
		got := make(chan []byte, 1)
		go func() {
			var buf bytes.Buffer
			_, err := rc.RecvStream(ctx, &buf, RecvOptions{})
			if err != nil {
				t.Error(err)
			}
			got <- buf.Bytes()
		}()
		st, err := sc.SendStream(ctx, bytes.NewReader(data), SendOptions{Compression: CompressZstd, LinkBitsPerSecond: bps})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(<-got, data) {
			t.Fatal("the stream arrived changed")
		}
		return st, sc
	}
	fast, fc := send(1e9)
	slow, sc := send(100e6)
	if fc.dense != nil || sc.dense == nil {
		t.Fatalf("dense encoder made on the 1 Gbit/s link: %v, on the 100 Mbit/s link: %v", fc.dense != nil, sc.dense != nil)
	}
	if float64(slow.WireBytes) > 0.95*float64(fast.WireBytes) {
		t.Fatalf("the dense stream took %d bytes on the wire, the fast one %d", slow.WireBytes, fast.WireBytes)
	}
	t.Logf("wire bytes: fast encoder %d, dense %d (of %d)", fast.WireBytes, slow.WireBytes, len(data))
}

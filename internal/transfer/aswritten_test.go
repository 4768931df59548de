package transfer

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the bytes written through it.
type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// TestSendDirAsWritten: a file named as written crosses before the
// directory is complete; the rest follows once it is, each file once, and
// the receiver gets the whole directory as SendDir would send it.
func TestSendDirAsWritten(t *testing.T) {
	src := filepath.Join(t.TempDir(), "images")
	if err := os.Mkdir(src, 0o700); err != nil {
		t.Fatal(err)
	}
	a, b := tcpPair(t)
	cc := &countingConn{Conn: a}
	sc, rc := NewConn(cc), NewConn(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	written := make(chan string, 8)
	done := make(chan result, 1)
	go func() {
		st, err := sc.SendDirAsWritten(ctx, src, written, nil, SendOptions{Compression: CompressOff})
		done <- result{st, err}
	}()
	recvd := make(chan result, 1)
	dst := filepath.Join(t.TempDir(), "dst")
	go func() {
		st, err := rc.RecvDir(ctx, dst, RecvOptions{})
		recvd <- result{st, err}
	}()

	writeFile(t, filepath.Join(src, "pages-1.img"), randomBytes(1<<20, 1), 0o600)
	written <- "pages-1.img"
	// It crosses now, while the directory is still being written.
	for cc.n.Load() < 1<<20 {
		select {
		case r := <-done:
			t.Fatalf("the stream ended early: %v", r.err)
		case <-ctx.Done():
			t.Fatalf("only %d bytes sent of a file named as written", cc.n.Load())
		case <-time.After(time.Millisecond):
		}
	}
	writeFile(t, filepath.Join(src, "pagemap-1.img"), randomBytes(300, 2), 0o600)
	writeFile(t, filepath.Join(src, "core-1.img"), randomBytes(5000, 3), 0o600)
	written <- "pagemap-1.img"
	// Ignored: sent already, outside the directory, missing, the root.
	for _, n := range []string{"pagemap-1.img", "pages-1.img", "../x", "a/b", "missing.img", ".", ""} {
		written <- n
	}
	close(written)
	snd, rcv := <-done, <-recvd
	if snd.err != nil || rcv.err != nil {
		t.Fatalf("send %v, receive %v", snd.err, rcv.err)
	}
	if snd.st.Files != 3 || rcv.st.Files != 3 || snd.st.EarlyFiles != 2 {
		t.Fatalf("files sent %d (%d early), received %d; want 3 (2 early)", snd.st.Files, snd.st.EarlyFiles, rcv.st.Files)
	}
	// The root's entry went first, with its times then.
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(src, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst)
}

// TestSendDirAsWrittenHalted: closing halt aborts the stream; the
// receiver discards what came and the connection stays usable.
func TestSendDirAsWrittenHalted(t *testing.T) {
	src := filepath.Join(t.TempDir(), "images")
	writeFile(t, filepath.Join(src, "pages-1.img"), randomBytes(200<<10, 1), 0o600)
	a, b := tcpPair(t)
	sc, rc := NewConn(a), NewConn(b)
	ctx := context.Background()
	written, halt := make(chan string, 1), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := sc.SendDirAsWritten(ctx, src, written, halt, SendOptions{})
		if !errors.Is(err, ErrHalted) {
			errc <- err
			return
		}
		errc <- sc.WriteMsg(ctx, "after", nil)
	}()
	written <- "pages-1.img"
	close(halt)
	parent := t.TempDir()
	if _, err := rc.RecvDir(ctx, filepath.Join(parent, "dst"), RecvOptions{}); !errors.Is(err, ErrAborted) {
		t.Fatalf("recv: %v, want ErrAborted", err)
	}
	if names := dirNames(t, parent); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
	if typ, _, err := rc.ReadMsg(ctx); err != nil || typ != "after" {
		t.Fatalf("message after abort: %q, %v", typ, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("sender: %v", err)
	}
}

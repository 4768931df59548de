package transfer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain fails the run when goroutines of this package outlive the tests:
// every producer and watcher must have been waited for.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(3 * time.Second)
		for {
			leaked := leakedGoroutines()
			if leaked == "" {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", leaked)
				code = 1
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	os.Exit(code)
}

func leakedGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/transfer.") && !strings.Contains(g, "TestMain") && !strings.Contains(g, "leakedGoroutines") {
			leaked = append(leaked, g)
		}
	}
	return strings.Join(leaked, "\n\n")
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { d.Close(); r.c.Close() })
	return d, r.c
}

// faultConn injects faults into what is written through it: one byte
// flipped at offset flipAt, or the connection closed after closeAt bytes.
// Negative offsets disable a fault.
type faultConn struct {
	net.Conn
	mu      sync.Mutex
	written int64
	flipAt  int64
	closeAt int64
}

func (f *faultConn) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flipAt >= f.written && f.flipAt < f.written+int64(len(p)) {
		q := bytes.Clone(p)
		q[f.flipAt-f.written] ^= 0x20
		p = q
	}
	if f.closeAt >= 0 && f.written+int64(len(p)) > f.closeAt {
		n, err := f.Conn.Write(p[:f.closeAt-f.written])
		f.written += int64(n)
		f.Conn.Close()
		if err == nil {
			err = net.ErrClosed
		}
		return n, err
	}
	n, err := f.Conn.Write(p)
	f.written += int64(n)
	return n, err
}

// result of one side of a transfer.
type result struct {
	st  Stats
	err error
}

// transferDir runs SendDir on one end of a fresh loopback connection (whose
// writes go through wrap, if set) and RecvDir on the other.
func transferDir(t *testing.T, src, dst string, so SendOptions, ro RecvOptions, wrap func(net.Conn) net.Conn) (send, recv result) {
	t.Helper()
	a, b := tcpPair(t)
	if wrap != nil {
		a = wrap(a)
	}
	sc, rc := NewConn(a), NewConn(b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		st, err := sc.SendDir(ctx, src, so)
		done <- result{st, err}
	}()
	recv.st, recv.err = rc.RecvDir(ctx, dst, ro)
	// A receiver that gave up stops reading: close so the sender ends.
	if recv.err != nil {
		rc.Close()
	}
	send = <-done
	return send, recv
}

// Data generators, deterministic per seed.

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// compressible looks like process memory: each 4 KiB page is a quarter
// random bytes and the rest a repeated record, so zstd gets about 3x.
func compressible(n int, seed uint64) []byte {
	rnd := randomBytes(n/4+4096, seed)
	record := []byte("key:000123 value=edgehop-session-state;ttl=3600;flags=0x0001\n")
	b := make([]byte, 0, n)
	for len(b) < n {
		page := make([]byte, 0, 4096)
		page = append(page, rnd[:1024]...)
		rnd = rnd[1024:]
		for len(page) < 4096 {
			page = append(page, record...)
		}
		b = append(b, page[:4096]...)
	}
	return b[:n]
}

func writeFile(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // beat the umask
		t.Fatal(err)
	}
}

// compareTrees fails unless got has exactly want's entries with the same
// types, modes, contents and link targets.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		seen[rel] = true
		wi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		gp := filepath.Join(got, rel)
		gi, err := os.Lstat(gp)
		if err != nil {
			t.Errorf("%s: missing: %v", rel, err)
			return nil
		}
		if wi.Mode().Type() != gi.Mode().Type() {
			t.Errorf("%s: type %v, want %v", rel, gi.Mode().Type(), wi.Mode().Type())
			return nil
		}
		if wi.Mode()&fs.ModeSymlink == 0 && wi.Mode()&modeMask != gi.Mode()&modeMask {
			t.Errorf("%s: mode %v, want %v", rel, gi.Mode(), wi.Mode())
		}
		if wi.Mode()&fs.ModeSymlink == 0 && !wi.ModTime().Equal(gi.ModTime()) {
			t.Errorf("%s: mtime %v, want %v", rel, gi.ModTime(), wi.ModTime())
		}
		if os.Geteuid() == 0 {
			ws, gs := wi.Sys().(*syscall.Stat_t), gi.Sys().(*syscall.Stat_t)
			if ws.Uid != gs.Uid || ws.Gid != gs.Gid {
				t.Errorf("%s: owner %d:%d, want %d:%d", rel, gs.Uid, gs.Gid, ws.Uid, ws.Gid)
			}
		}
		switch {
		case wi.Mode()&fs.ModeSymlink != 0:
			wt, _ := os.Readlink(p)
			gt, _ := os.Readlink(gp)
			if wt != gt {
				t.Errorf("%s: target %q, want %q", rel, gt, wt)
			}
		case wi.Mode().IsRegular():
			wb, _ := os.ReadFile(p)
			gb, _ := os.ReadFile(gp)
			if !bytes.Equal(wb, gb) {
				t.Errorf("%s: content differs (%d bytes, want %d)", rel, len(gb), len(wb))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = filepath.WalkDir(got, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(got, p)
		if !seen[rel] {
			t.Errorf("%s: unexpected extra entry", rel)
		}
		return nil
	})
}

// dirNames lists the names in dir.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// slowReader yields data in pieces with a pause, like pages read from a
// process while they are being sent.
type slowReader struct {
	data  []byte
	piece int
	pause time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	n := copy(p, r.data[:min(len(r.data), r.piece)])
	r.data = r.data[n:]
	return n, nil
}

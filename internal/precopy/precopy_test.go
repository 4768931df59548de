package precopy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
	"github.com/edgehop/edgehop/internal/transfer"
)

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// connPair returns the two ends of a loopback TCP connection as transfer
// connections (no TLS: the stream format is what is tested). wrap, when
// set, wraps the source's end (a rate limit).
func connPair(t testing.TB, wrap func(net.Conn) net.Conn) (src, dst *transfer.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2 := <-accepted
	if c2 == nil {
		t.Fatal("accept failed")
	}
	if wrap != nil {
		c1 = wrap(c1)
	}
	src, dst = transfer.NewConn(c1), transfer.NewConn(c2)
	t.Cleanup(func() { src.Close(); dst.Close() })
	return src, dst
}

// runRounds runs live rounds with Source.Rounds the way a migration
// wires them: the source announces each round with a message, the
// destination reads messages and receives a round for each until told
// the source froze. It checks that both ends counted the same pages.
func runRounds(t testing.TB, ctx context.Context, s *Source, st *Store, src, dst *transfer.Conn, rule StopRule) ([]RoundStats, StopReason) {
	t.Helper()
	type result struct {
		rounds []RoundStats
		err    error
	}
	recv := make(chan result, 1)
	go func() {
		var res result
		defer func() { recv <- res }()
		for {
			typ, _, err := dst.ReadMsg(ctx)
			if err != nil {
				res.err = err
				return
			}
			switch typ {
			case "round":
				r, err := st.ReceiveRound(ctx, dst)
				if err != nil {
					res.err = err
					return
				}
				res.rounds = append(res.rounds, r)
			case "frozen":
				return
			default:
				res.err = fmt.Errorf("unexpected message %q", typ)
				return
			}
		}
	}()
	sent, why, err := s.Rounds(ctx, src, rule, func(ctx context.Context, round int) error {
		return src.WriteMsg(ctx, "round", round)
	})
	if err == nil {
		err = src.WriteMsg(ctx, "frozen", nil)
	}
	got := <-recv
	if err != nil || got.err != nil {
		t.Fatalf("rounds: send %v, receive %v", err, got.err)
	}
	if len(got.rounds) != len(sent) {
		t.Fatalf("sent %d rounds, received %d", len(sent), len(got.rounds))
	}
	for i, r := range got.rounds {
		w := sent[i]
		if r.Round != w.Round || r.Changed != w.Changed || r.DataPages != w.DataPages || r.XorPages != w.XorPages ||
			r.ZeroPages != w.ZeroPages || r.CopyPages != w.CopyPages || r.Bytes != w.Bytes {
			t.Fatalf("round %d: sent %+v, received %+v", w.Round, w, r)
		}
	}
	return sent, why
}

// doFinal runs the final delta from dumpDir into rebuiltDir and returns
// what both ends counted.
func doFinal(t testing.TB, ctx context.Context, s *Source, st *Store, src, dst *transfer.Conn, dumpDir, rebuiltDir string) (sent, rebuilt FinalStats) {
	t.Helper()
	type result struct {
		st  FinalStats
		err error
	}
	recv := make(chan result, 1)
	go func() {
		r, err := st.RebuildFinal(ctx, dst, rebuiltDir)
		recv <- result{r, err}
	}()
	sent, err := s.SendFinal(ctx, src, dumpDir, nil, nil, nil)
	got := <-recv
	if err != nil || got.err != nil {
		t.Fatalf("final: send %v, rebuild %v", err, got.err)
	}
	r := got.st
	t.Logf("final: sent in %v, rebuilt in %v", sent.Duration.Round(time.Millisecond), r.Duration.Round(time.Millisecond))
	if r.Pages != sent.Pages || r.HeldPages != sent.HeldPages || r.DataPages != sent.DataPages || r.XorPages != sent.XorPages ||
		r.CopyPages != sent.CopyPages || r.ZeroPages != sent.ZeroPages || r.DumpBytes != sent.DumpBytes {
		t.Fatalf("final: sent %+v, rebuilt %+v", sent, r)
	}
	return sent, r
}

// criuDump dumps the process tree of pid into dir and leaves it running
// (shellJob: the tree's session is outside it).
func criuDump(t testing.TB, pid int, dir string, shellJob bool) time.Duration {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	args := []string{"dump", "-t", fmt.Sprint(pid), "-D", dir, "--leave-running", "-o", "dump.log"}
	if shellJob {
		args = append(args, "--shell-job")
	}
	out, err := exec.Command("criu", args...).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("criu dump: %v\n%s\n%s", err, out, tail(log, 2000))
	}
	return time.Since(t0)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// sameTree fails unless directories a (a dump) and b (rebuilt from it)
// hold the same names, besides b's parent directory, with the same
// permissions and bytes; the memory images need only describe the same
// memory (pages held at the destination stay in the parent).
func sameTree(t testing.TB, a, b string) {
	t.Helper()
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			if dir == b && e.Name() == ParentDir && e.IsDir() {
				continue
			}
			out = append(out, e.Name())
		}
		return out
	}
	na, nb := names(a), names(b)
	if !slices.Equal(na, nb) {
		t.Fatalf("%s has %v, %s has %v", a, na, b, nb)
	}
	for _, n := range na {
		fa, _ := os.Stat(filepath.Join(a, n))
		fb, _ := os.Stat(filepath.Join(b, n))
		if fa.Mode() != fb.Mode() {
			t.Errorf("%s: mode %v, rebuilt %v", n, fa.Mode(), fb.Mode())
		}
		if IsMemoryImage(n) {
			if pagemapImageRE.MatchString(n) && !maps.EqualFunc(memoryOf(t, a, n), memoryOf(t, b, n), bytes.Equal) {
				t.Errorf("%s: the memory it describes differs", n)
			}
			continue
		}
		da, err1 := os.ReadFile(filepath.Join(a, n))
		db, err2 := os.ReadFile(filepath.Join(b, n))
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", n, err1, err2)
		}
		if !bytes.Equal(da, db) {
			t.Errorf("%s differs (%d and %d bytes)", n, len(da), len(db))
		}
	}
}

// readyInfo reads the page and hot page counts of the helper and its
// children.
func readyInfo(t testing.TB, spec helperSpec) (pages, hot int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(spec.dir, "ready"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(string(b), &pages, &hot); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < spec.children; k++ {
		p, h := readyInfo(t, spec.childSpec(k))
		pages, hot = pages+p, hot+h
	}
	return pages, hot
}

// TestRoundsFinalAndRestore copies a running process in live rounds, dumps
// it with CRIU, sends the final delta, and checks that the rebuilt image
// directory is byte-identical to the dump, that the final round sent
// about what changed after the rounds rather than everything, and that
// CRIU restores a process with intact memory from the rebuilt images.
//
// In the pid namespace case the helper is a namespace's init, like a
// container's: CRIU names its images by namespace pid (pagemap-1.img),
// which the rounds must key their pages by, or nothing would be held.
func TestRoundsFinalAndRestore(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "criu")
	for _, pidns := range []bool{false, true} {
		t.Run(map[bool]string{false: "host-pidns", true: "own-pidns"}[pidns], func(t *testing.T) {
			if pidns {
				testutil.RequireTool(t, "unshare", "setsid")
			}
			roundsFinalAndRestore(t, pidns)
		})
	}
}

func roundsFinalAndRestore(t *testing.T, pidns bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := shmDir(t)
	spec := helperSpec{mb: 48, hotPct: 10, cycleMs: 100, children: 2, dir: dir}
	helper := startHelper(t, spec, pidns)
	pid := helper.pid
	npages, hot := readyInfo(t, spec)

	src, dst := connPair(t, nil)
	source, err := NewSource(Config{Pid: pid, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	store, err := NewStore(filepath.Join(dir, "store"), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	history, why := runRounds(t, ctx, source, store, src, dst, StopRule{MaxRounds: 4, DeltaBytes: 64 << 10})
	for _, r := range history {
		t.Logf("round %d: %d pages read, %d changed (%d data of which %d XOR, %d zero, %d copy, %d skipped), %d wire bytes, read %.0f MB/s, %v",
			r.Round, r.Pages, r.Changed, r.DataPages, r.XorPages, r.ZeroPages, r.CopyPages, r.Skipped, r.Bytes, r.ReadThroughput()/1e6, r.Duration)
	}
	t.Logf("stopped: %s", why)
	first := history[0]
	if first.Processes != 1+spec.children {
		t.Fatalf("first round read %d processes, the tree has %d", first.Processes, 1+spec.children)
	}
	if first.Pages < npages || first.Changed != first.Pages {
		t.Fatalf("first round read %d pages, sent %d; the helpers alone have %d", first.Pages, first.Changed, npages)
	}
	// The children's buffers repeat their parent's: copies, not data.
	rootPages, _ := readyInfo(t, helperSpec{dir: dir})
	if first.DataPages < rootPages*9/10 || first.CopyPages < (npages-rootPages)*9/10 {
		t.Fatalf("first round sent %d data and %d copied pages; the root helper has %d distinct pages, its children %d repeating them",
			first.DataPages, first.CopyPages, rootPages, npages-rootPages)
	}
	// Besides the hot pages, the helpers' Go runtimes write some of
	// their own (many more under the race detector, whose shadow memory
	// is dumped too).
	churn := first.Pages / 16
	for _, r := range history[1:] {
		// Later rounds send what changed: far from everything.
		if r.Changed > hot+churn || r.Changed > first.Changed/4 {
			t.Fatalf("round %d sent %d pages; %d are hot, the first round sent %d", r.Round, r.Changed, hot, first.Changed)
		}
	}
	if int64(source.HeldPages()) < npages {
		t.Fatalf("source thinks the destination holds %d pages, fewer than the helper's %d", source.HeldPages(), npages)
	}

	dump := filepath.Join(dir, "dump")
	dumpTime := criuDump(t, pid, dump, !pidns)
	rebuilt := filepath.Join(dir, "rebuilt")
	f, _ := doFinal(t, ctx, source, store, src, dst, dump, rebuilt)
	sameTree(t, dump, rebuilt)
	t.Logf("dump %v: %d pages (%d bytes) in %d images; final: %d held, %d copied, %d zero, %d data of which %d XOR; %d meta + %d delta wire bytes in %v",
		dumpTime, f.Pages, f.DumpBytes, f.Images, f.HeldPages, f.CopyPages, f.ZeroPages, f.DataPages, f.XorPages, f.MetaBytes, f.DeltaBytes, f.Duration)
	if f.Images != 1+spec.children {
		t.Fatalf("%d pages images for %d processes", f.Images, 1+spec.children)
	}
	if f.HeldPages < f.Pages*3/4 {
		t.Fatalf("only %d of %d dumped pages were held: pages keyed by the wrong pid?", f.HeldPages, f.Pages)
	}
	if f.DataPages > hot+churn || f.DataPages > f.Pages/4 {
		t.Fatalf("final round sent %d data pages of %d; only %d are hot", f.DataPages, f.Pages, hot)
	}
	// The hot pages change a word each cycle: those that changed in a
	// round after the first go as XORs with the copy that round sent.
	if f.XorPages < f.DataPages/2 {
		t.Fatalf("final round sent %d of %d data pages as XOR; the hot pages change in a word", f.XorPages, f.DataPages)
	}
	changed := f.DataPages * PageSize
	t.Logf("final delta wire bytes / changed bytes = %d / %d = %.3f; final bytes / dump bytes = %.3f",
		f.DeltaBytes, changed, float64(f.DeltaBytes)/float64(max(1, changed)), float64(f.Bytes())/float64(f.DumpBytes))
	if f.DeltaBytes > changed*11/10+int64(f.Pages)*4+64<<10 {
		t.Fatalf("final delta of %d bytes for %d changed bytes", f.DeltaBytes, changed)
	}
	if _, err := source.Round(ctx, src); err == nil {
		t.Fatal("a round after the final delta")
	}
	// The held pages stayed in the store: only the others were written.
	var written int64
	ents, _ := os.ReadDir(rebuilt)
	for _, e := range ents {
		if isPagesImage(e.Name()) {
			fi, _ := e.Info()
			written += fi.Size()
		}
	}
	if want := (f.Pages - f.HeldPages) * PageSize; written != want {
		t.Fatalf("rebuilt pages images hold %d bytes, want the %d of the pages not held", written, want)
	}

	// Restore the process from the rebuilt images in place of the
	// original and let it check its own memory.
	helper.kill()
	restored := restoreHelper(t, rebuilt, dir, !pidns)
	if !pidns && restored != pid {
		t.Fatalf("restored pid %d, dumped %d", restored, pid)
	}
	if err := syscall.Kill(restored, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var verdict string
	testutil.Eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(dir, "check"))
		verdict = string(b)
		return err
	})
	if !strings.HasPrefix(verdict, "ok") {
		t.Fatalf("restored helper: %s", verdict)
	}
	t.Logf("restored helper: %s", strings.TrimSpace(verdict))
}

// restoreHelper restores the dumped helper from dir (detached, reparented
// to this process, a child subreaper, which reaps the tree when the test
// ends) and returns its pid.
func restoreHelper(t testing.TB, imgDir, scratch string, shellJob bool) int {
	t.Helper()
	work := filepath.Join(scratch, "restore-work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	pidfile := filepath.Join(work, "pid")
	args := []string{"restore", "-D", imgDir, "-W", work, "-d", "--pidfile", pidfile, "-o", "restore.log"}
	if shellJob {
		args = append(args, "--shell-job")
	}
	out, err := exec.Command("criu", args...).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "restore.log"))
		t.Fatalf("criu restore: %v\n%s\n%s", err, out, tail(log, 3000))
	}
	var pid int
	b, err := os.ReadFile(pidfile)
	if err == nil {
		_, err = fmt.Sscan(string(b), &pid)
	}
	if err != nil {
		t.Fatalf("restored pid: %v", err)
	}
	t.Cleanup(func() {
		killTree(pid, func() {
			if p, err := os.FindProcess(pid); err == nil {
				p.Kill()
				p.Wait()
			}
		})
	})
	return pid
}

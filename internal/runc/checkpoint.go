package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"github.com/edgehop/edgehop/internal/criuimg"
	"github.com/edgehop/edgehop/internal/linux"
)

// CRIU log files runc asks CRIU to write into the work directory.
const (
	DumpLog    = "dump.log"
	RestoreLog = "restore.log"
)

// CheckpointOpts configures Checkpoint. Paths must be absolute (runc
// resolves relative ones against its own working directory, which CRIU
// does not share).
type CheckpointOpts struct {
	// ImagePath receives the CRIU images (and runc's descriptors.json);
	// created when missing. Required.
	ImagePath string
	// WorkPath receives CRIU's dump.log; ImagePath when empty.
	WorkPath string
	// LeaveRunning keeps the container running after the dump.
	LeaveRunning bool
	// TCPEstablished dumps established TCP connections (CRIU's TCP
	// repair). CRIU then locks the container's network namespace with
	// its iptables "CRIU" chain for the dump; on a failed dump the chain
	// may stay behind and the caller must remove it.
	TCPEstablished bool
	// ExtUnixSk allows unix sockets connected to peers outside the
	// container.
	ExtUnixSk bool
	// FileLocks dumps file locks.
	FileLocks bool
	// LazyPages leaves memory pages out of the images; CRIU serves them
	// from a page server listening on PageServer, and Checkpoint returns
	// only once the restoring side has fetched them all (or failed).
	LazyPages bool
	// PageServer is "host:port". With LazyPages it is where this side's
	// page server listens; without, CRIU sends the pages to a
	// `criu page-server` listening there (see StartPageServer) instead
	// of writing them to ImagePath.
	PageServer string
	// Ready, when set, is called once the images may be shipped and the
	// restore started, before runc is done (Checkpoint returns only then,
	// with the dump's outcome): with LazyPages when CRIU reports through
	// runc's --status-fd that the dump is written and the page server
	// listens; otherwise when CRIU has written its last image (stats-dump,
	// written only by a dump that succeeded), while runc goes on removing
	// the container. It runs on a goroutine Checkpoint waits for before
	// returning, and must not block.
	Ready func()
	// ManageCgroupsMode is runc's --manage-cgroups-mode: "" (runc's
	// default, soft), "soft", "full" or "strict".
	ManageCgroupsMode string
	// Gate, when set, holds CRIU back before it touches the container
	// until Gate.Open (see Gate); if ctx ends first, Checkpoint fails with
	// the container untouched.
	Gate *Gate
	// RealIDs, when set, are the real uid and gid runc and CRIU run
	// with; their effective ids and capabilities stay root's. CRIU reads
	// every process's rlimits, which the kernel allows without
	// CAP_SYS_RESOURCE only to a caller whose real uid and gid are the
	// process's own (check_prlimit_permission): for a service running as
	// one non-root user, set them to that user's.
	RealIDs *IDs
}

// IDs are a user and group id.
type IDs struct {
	UID, GID int
}

// Validate reports what is wrong with o.
func (o CheckpointOpts) Validate() error {
	var errs []error
	if !filepath.IsAbs(o.ImagePath) {
		errs = append(errs, fmt.Errorf("image path %q must be absolute", o.ImagePath))
	}
	if o.WorkPath != "" && !filepath.IsAbs(o.WorkPath) {
		errs = append(errs, fmt.Errorf("work path %q must be absolute", o.WorkPath))
	}
	if o.LazyPages && o.PageServer == "" {
		errs = append(errs, errors.New("lazy pages need a page server address"))
	}
	if o.PageServer != "" {
		if _, _, err := net.SplitHostPort(o.PageServer); err != nil {
			errs = append(errs, fmt.Errorf("page server %q: %w", o.PageServer, err))
		}
	}
	errs = append(errs, validCgroupsMode(o.ManageCgroupsMode))
	if o.RealIDs != nil && (o.RealIDs.UID < 0 || o.RealIDs.GID < 0) {
		errs = append(errs, fmt.Errorf("real ids %d:%d must not be negative", o.RealIDs.UID, o.RealIDs.GID))
	}
	return errors.Join(errs...)
}

func validCgroupsMode(m string) error {
	switch m {
	case "", "soft", "full", "strict":
		return nil
	}
	return fmt.Errorf("manage cgroups mode %q is not soft, full or strict", m)
}

// Checkpoint dumps container id with CRIU through `runc checkpoint`.
// Without LeaveRunning the container is gone afterwards (runc deletes
// it) and Checkpoint waits until its output has been copied out.
//
// A container in a network namespace given by path (Spec.NetNSPath) is
// dumped with that namespace as external; Restore re-binds it to the
// namespace path of the restore bundle.
//
// A failure is an *Error with runc's message and CRIU's reason from
// dump.log. Cancelling ctx aborts the dump: without LazyPages runc is
// killed and CRIU rolls back (resuming the container) at its next
// exchange with runc, possibly a moment after Checkpoint has returned;
// with LazyPages CRIU's page server is made to fail unless a lazy-pages
// daemon is already fetching, which CRIU then completes.
func (r *Runtime) Checkpoint(ctx context.Context, id string, o CheckpointOpts) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	probe := r.CheckCRIU
	if o.LazyPages {
		probe = r.CheckLazyPages
	}
	if err := probe(ctx); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	work := o.WorkPath
	if work == "" {
		work = o.ImagePath
	}
	for _, d := range []string{o.ImagePath, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("checkpoint %s: %w", id, err)
		}
	}
	logPath := filepath.Join(work, DumpLog)
	// A stale log would give a stale reason.
	if err := os.Remove(logPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}

	args := []string{"--image-path", o.ImagePath, "--work-path", work}
	flag := func(on bool, name string) {
		if on {
			args = append(args, name)
		}
	}
	flag(o.LeaveRunning, "--leave-running")
	flag(o.TCPEstablished, "--tcp-established")
	flag(o.ExtUnixSk, "--ext-unix-sk")
	flag(o.FileLocks, "--file-locks")
	flag(o.LazyPages, "--lazy-pages")
	if o.PageServer != "" {
		args = append(args, "--page-server", o.PageServer)
	}
	if o.ManageCgroupsMode != "" {
		args = append(args, "--manage-cgroups-mode", o.ManageCgroupsMode)
	}
	inv := invocation{op: "checkpoint", id: id, criu: true, criuLog: logPath, realIDs: o.RealIDs}

	var (
		readyDone chan struct{}
		statusR   *os.File
	)
	var imagesWritten func() // the non-lazy Ready, once
	if o.Ready != nil && !o.LazyPages {
		var once sync.Once
		imagesWritten = func() { once.Do(o.Ready) }
		stop, err := watchWritten(work, statsDumpFile, imagesWritten)
		if err != nil {
			return fmt.Errorf("checkpoint %s: watch images: %w", id, err)
		}
		defer stop()
	}
	if o.Ready != nil && o.LazyPages {
		rd, wr, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("checkpoint %s: status pipe: %w", id, err)
		}
		statusR = rd
		inv.extra = []*os.File{wr}
		args = append(args, "--status-fd", "3")
		readyDone = make(chan struct{})
		go func() {
			defer close(readyDone)
			var b [1]byte
			// End of file without a byte means CRIU failed before it
			// was ready; Checkpoint's error says why.
			if n, _ := io.ReadFull(rd, b[:]); n == 1 {
				o.Ready()
			}
		}()
	}
	inv.args = args
	if o.Gate != nil {
		_, closeGate, err := r.useGate(ctx, o.Gate, &inv)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", id, err)
		}
		defer closeGate()
	}
	if o.LazyPages {
		// Killing runc would orphan its CRIU, which keeps the container
		// stopped while it waits for a page client forever. Instead make
		// CRIU's page server fail: it then rolls the dump back and resumes
		// the container, and runc exits with the error.
		var wg sync.WaitGroup
		stop := make(chan struct{})
		inv.cancel = func() error {
			// os/exec calls this before Wait returns, so before the
			// deferred wg.Wait below.
			wg.Add(1)
			go func() {
				defer wg.Done()
				abortLazyDump(stop, o.PageServer)
			}()
			return nil
		}
		defer func() {
			close(stop)
			wg.Wait()
		}()
	}

	start := time.Now()
	_, err := r.exec(ctx, inv) // an *Error names the op and id itself
	if readyDone != nil {
		// Closing our write end lets the reader see end of file once
		// runc and CRIU are gone. A CRIU orphaned by a killed runc may
		// still hold its copy: stop waiting for it after a while.
		inv.extra[0].Close()
		select {
		case <-readyDone:
		case <-time.After(time.Second):
		}
		statusR.Close()
		<-readyDone
	}
	if err != nil {
		return err
	}
	if imagesWritten != nil {
		imagesWritten() // had the watch not seen it yet
	}
	r.logger().Info("checkpointed container", "id", id, "took", time.Since(start),
		"images", o.ImagePath, "lazy", o.LazyPages, "leave_running", o.LeaveRunning)
	if !o.LeaveRunning {
		r.endStreams(ctx, id)
	}
	return nil
}

// abortLazyDump makes the page server of a lazy dump at addr fail, until
// stop is closed. CRIU's page server accepts one client; a client that
// sends a truncated request header fails the session ("Can't read
// pagemap from socket"), which fails the dump and makes CRIU resume the
// container. (A client that just closes ends the session as complete, and
// CRIU then kills the container as after a finished migration.) Once a
// lazy-pages daemon is connected the dial is refused and the transfer
// runs to its end, or fails with the daemon. The connection resets if it
// closes before the byte went out (this process killed in between): end
// of file alone would be the clean end.
func abortLazyDump(stop <-chan struct{}, addr string) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := linux.DialAbortive(ctx, addr)
		cancel()
		if err == nil {
			_, _ = c.Write([]byte{0})
			c.Close()
			return
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// RestoreOpts configures Restore. Paths must be absolute.
type RestoreOpts struct {
	// ImagePath holds the images of a Checkpoint (shipped here by the
	// caller). Required.
	ImagePath string
	// WorkPath receives CRIU's restore.log (and, with LazyPages, is
	// where runc's CRIU finds the lazy-pages daemon's socket: it must be
	// the daemon's LazyPagesOpts.WorkPath). ImagePath when empty.
	WorkPath string
	// TCPEstablished restores established TCP connections. The caller
	// must have loaded CRIU's lock chain into the destination namespace
	// before its link came up; CRIU removes it when the restore is done.
	TCPEstablished bool
	ExtUnixSk      bool
	FileLocks      bool
	// LazyPages restores without memory pages; a `criu lazy-pages`
	// daemon (StartLazyPages) must already be running for WorkPath.
	LazyPages bool
	// ManageCgroupsMode is runc's --manage-cgroups-mode ("" = soft).
	ManageCgroupsMode string
	// Cgroups, when set, are the container's cgroup v1 cgroups (one per
	// hierarchy, CgroupV1.Dirs; made, CgroupV1.Make), which runc starts
	// in: runc 1.1 restores the container's cgroup mount as binds of the
	// cgroups it runs in.
	Cgroups []CgroupDir
	// Gate, when set, holds CRIU back until Gate.Open: runc starts,
	// mounts and prepares the restore meanwhile (it reads only
	// descriptors.json from ImagePath, which must be there); the other
	// images must be in ImagePath when the gate opens. A gate of its own
	// for each restore; if ctx ends first, the restore fails with nothing
	// restored. Until the gate opens runc runs niced (deferToGate),
	// unless Urgent: the restore is already awaited.
	Gate   *Gate
	Urgent bool
	// Resumed, when set, is called (once, on its own goroutine; it must
	// not block) when CRIU has resumed the restored tasks: CRIU writes
	// its stats-restore then, and only when the restore succeeded. runc
	// still answers CRIU's last notification, waits for CRIU to exit and
	// exits (a few ms); Restore returns only then. After Resumed a runc
	// that fails leaves a running container in place: Restore returns
	// its pid, and fails only when the container no longer runs.
	Resumed func()
}

// useGate readies g for the runc command inv: with the shim, inv's
// environment names the gate's socket and shim is true; without, the gate
// has opened when useGate returns (runc starts only then). closeGate,
// called once runc is done, makes a gate still waiting give up.
func (r *Runtime) useGate(ctx context.Context, g *Gate, inv *invocation) (shim bool, closeGate func(), err error) {
	gctx, gcancel := context.WithCancel(ctx)
	name, closeSocket, err := r.gate(gctx, g)
	if err != nil {
		gcancel()
		return false, nil, err
	}
	if name != "" {
		inv.env = append(inv.env, shimEnvGate+"="+name)
	}
	return name != "", func() {
		gcancel() // first: a gate still waiting to open gives up
		if closeSocket != nil {
			closeSocket()
		}
	}, nil
}

// gatedNice is how much nicer than the agent a gated restore's runc
// runs until its gate opens: it prepares while the images are still on
// their way, and on a node that also dumps (a testbed on one host) it
// must not take the CPU from the dump they are waiting for.
const gatedNice = 10

// deferToGate makes the gated restore inv run gatedNice nicer than this
// process until g opens (runc's process group: runc, and the shim waiting
// at the gate, which becomes CRIU). It needs inv.group. Started in the
// container's cgroups (cgroups), runc competes for the CPU as that cpu
// cgroup, whatever its nice value: the cgroup's share is lowered as much
// until g opens.
func deferToGate(inv *invocation, g *Gate, cgroups []CgroupDir) {
	base, err := linux.Nice()
	if err != nil {
		return
	}
	restoreShares := lowerShares(cgroups)
	var mu sync.Mutex
	pgid, opened := 0, false
	inv.started = func(pid int) {
		mu.Lock()
		defer mu.Unlock()
		if !opened {
			pgid = pid
			_ = linux.SetGroupNice(pid, min(base+gatedNice, 19))
		}
	}
	g.setOpening(func() {
		mu.Lock()
		defer mu.Unlock()
		opened = true
		restoreShares()
		if pgid != 0 {
			_ = linux.SetGroupNice(pgid, base)
		}
	})
}

// gatedShares is the cpu.shares of a gated restore's cpu cgroup until its
// gate opens: a nice-10 task's weight (110) against the default 1024.
const gatedShares = "110"

// lowerShares sets the cpu.shares of the cpu cgroup among cgroups to
// gatedShares and returns what puts the previous value back (the
// default, when a restore called off at its gate left gatedShares).
func lowerShares(cgroups []CgroupDir) func() {
	for _, d := range cgroups {
		f := filepath.Join(d.Dir(), "cpu.shares")
		was, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if was = bytes.TrimSpace(was); string(was) == gatedShares {
			was = []byte(defaultShares)
		}
		if os.WriteFile(f, []byte(gatedShares), 0) != nil {
			break
		}
		return func() { _ = os.WriteFile(f, was, 0) }
	}
	return func() {}
}

// defaultShares is a new cpu cgroup's cpu.shares.
const defaultShares = "1024"

// DescriptorsFile is the file runc writes in a checkpoint's image
// directory before CRIU runs (the container's stdio as CRIU will see
// it), and the only one a restore reads before CRIU does.
const DescriptorsFile = "descriptors.json"

// gateCallOffGrace is how long a gated restore called off at its gate
// gives runc to fail and clean up before it is killed.
const gateCallOffGrace = 10 * time.Second

// Validate reports what is wrong with o.
func (o RestoreOpts) Validate() error {
	var errs []error
	if !filepath.IsAbs(o.ImagePath) {
		errs = append(errs, fmt.Errorf("image path %q must be absolute", o.ImagePath))
	}
	if o.WorkPath != "" && !filepath.IsAbs(o.WorkPath) {
		errs = append(errs, fmt.Errorf("work path %q must be absolute", o.WorkPath))
	}
	errs = append(errs, validCgroupsMode(o.ManageCgroupsMode))
	return errors.Join(errs...)
}

// Restore recreates container id from the images of a Checkpoint with
// `runc restore --detach`, using the bundle's config.json (so its network
// namespace path, rootfs and cgroup path apply), and returns the pid of
// the restored init process. The restored processes get new stdio pipes
// copied into o, as Run does. First, a task the dump found waiting in a
// poll, sleep or futex with a timeout is made to wait again rather than
// see the EINTR CRIU recorded (criuimg.RestartSyscalls).
//
// A failure is an *Error with runc's message and CRIU's reason from
// restore.log; runc state left behind by the failed restore is removed.
func (r *Runtime) Restore(ctx context.Context, id, bundle string, o RestoreOpts, io IO) (int, error) {
	if err := o.Validate(); err != nil {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	probe := r.CheckCRIU
	if o.LazyPages {
		probe = r.CheckLazyPages
	}
	if err := probe(ctx); err != nil {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	work := o.WorkPath
	if work == "" {
		work = o.ImagePath
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	logPath := filepath.Join(work, RestoreLog)
	if err := os.Remove(logPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("restore %s: %w", id, err)
	}
	restart := func() error {
		if _, err := criuimg.RestartSyscalls(o.ImagePath); err != nil {
			return fmt.Errorf("restore %s: %w", id, err)
		}
		return nil
	}
	inv := invocation{op: "restore", id: id, criu: true, criuLog: logPath, group: true}
	if o.Resumed != nil {
		stop, err := watchResumed(work, o.Resumed, &inv)
		if err != nil {
			return 0, fmt.Errorf("restore %s: %w", id, err)
		}
		defer stop()
	}
	var runcPID atomic.Int64 // a gated restore's runc, once started
	if o.Gate == nil {
		if err := restart(); err != nil {
			return 0, err
		}
	} else {
		o.Gate.prepare = restart
		shim, closeGate, err := r.useGate(ctx, o.Gate, &inv)
		if err != nil {
			return 0, fmt.Errorf("restore %s: %w", id, err)
		}
		defer closeGate()
		if shim {
			if !o.Urgent {
				deferToGate(&inv, o.Gate, o.Cgroups)
			}
			onStart := inv.started
			inv.started = func(pid int) {
				if onStart != nil {
					onStart(pid)
				}
				runcPID.Store(int64(pid))
			}
		} else if err := restart(); err != nil {
			// No shim: the gate opened before runc started.
			return 0, err
		}
	}
	args := []string{"--image-path", o.ImagePath, "--work-path", work}
	if o.TCPEstablished {
		args = append(args, "--tcp-established")
	}
	if o.ExtUnixSk {
		args = append(args, "--ext-unix-sk")
	}
	if o.FileLocks {
		args = append(args, "--file-locks")
	}
	if o.LazyPages {
		args = append(args, "--lazy-pages")
	}
	if o.ManageCgroupsMode != "" {
		args = append(args, "--manage-cgroups-mode", o.ManageCgroupsMode)
	}
	start := time.Now()
	inv.args = args
	inv.cgroups = o.Cgroups
	ectx := ctx
	if o.Gate != nil {
		// At the gate, a restore called off is not killed: the gate
		// closes, CRIU is never run, and runc fails and removes what it
		// made (its state, its mounts, the cgroups). Past the gate, or
		// when runc does not leave within a grace period, ctx kills it.
		var ecancel context.CancelCauseFunc
		ectx, ecancel = context.WithCancelCause(context.WithoutCancel(ctx))
		defer ecancel(nil)
		stop := context.AfterFunc(ctx, func() {
			grace := gateCallOffGrace
			select {
			case <-o.Gate.open:
				grace = 0
			default:
				// runc, in the container's cgroups, would remove them
				// in vain until it gave up (~150 ms): it leaves them
				// first.
				if pid := runcPID.Load(); pid > 0 {
					leaveCgroups(int(pid), o.Cgroups)
				}
			}
			time.AfterFunc(grace, func() { ecancel(context.Cause(ctx)) })
		})
		defer stop()
	}
	pid, err := r.start(ectx, inv, bundle, io)
	if err != nil {
		if o.Gate != nil && o.Gate.prepared() != nil {
			return 0, o.Gate.prepared() // why the gate called CRIU off
		}
		return 0, err // an *Error names the op and id itself
	}
	// (Gated: took counts the wait for the images at the gate.)
	r.logger().Info("restored container", "id", id, "pid", pid, "took", time.Since(start),
		"images", o.ImagePath, "lazy", o.LazyPages, "gated", o.Gate != nil)
	return pid, nil
}

// watchResumed calls resumed when CRIU writes stats-restore into work,
// unless inv's runc failed and its outcome was decided first: inv then
// keeps a running container only when resumed was called (its
// afterResume says so).
func watchResumed(work string, resumed func(), inv *invocation) (func(), error) {
	if err := os.Remove(filepath.Join(work, stats.StatsRestore)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var mu sync.Mutex
	called, decided := false, false
	stop, err := watchWritten(work, stats.StatsRestore, func() {
		mu.Lock()
		defer mu.Unlock()
		if !decided {
			called = true
			resumed()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch restore: %w", err)
	}
	inv.afterResume = func() bool {
		mu.Lock()
		defer mu.Unlock()
		decided = true
		return called
	}
	inv.pidFromState = true
	return stop, nil
}

// AbortLazyDump makes the page server of a lazy dump at addr fail (see
// abortLazyDump) until it succeeds or ctx ends: a restarted agent uses it
// on a dump whose agent died, so CRIU resumes the container and its runc
// exits.
func AbortLazyDump(ctx context.Context, addr string) {
	abortLazyDump(ctx.Done(), addr)
}

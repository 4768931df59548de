package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// CRIU log files of the receiving-side daemons, in their work directory.
const (
	LazyPagesLog  = "lazy-pages.log"
	PageServerLog = "page-server.log"
)

// Daemon is a CRIU process on the receiving node of a memory transfer:
// `criu lazy-pages`, which serves a lazy restore's page faults from the
// source's page server, or `criu page-server`, which receives the pages of
// a dump into an image directory. It ends by itself when the transfer is
// complete. Its methods are safe for concurrent use.
type Daemon struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has been waited for
	err     error         // the process's exit error; written before done closes
}

// LazyPagesOpts configures StartLazyPages.
type LazyPagesOpts struct {
	// ImagePath holds the lazy checkpoint's images (without pages), as
	// for the restore. Required, absolute.
	ImagePath string
	// WorkPath is where the daemon creates its lazy-pages.socket and log;
	// the lazy Restore must use the same RestoreOpts.WorkPath. ImagePath
	// when empty.
	WorkPath string
	// PageServer is the "host:port" of the source's page server
	// (CheckpointOpts.PageServer).
	PageServer string
}

// StartLazyPages starts `criu lazy-pages` and returns once it is ready for
// a lazy Restore. The daemon exits when every page has been fetched.
// Cancelling ctx kills it.
func (r *Runtime) StartLazyPages(ctx context.Context, o LazyPagesOpts) (*Daemon, error) {
	if err := r.CheckLazyPages(ctx); err != nil {
		return nil, fmt.Errorf("start lazy-pages: %w", err)
	}
	host, port, err := net.SplitHostPort(o.PageServer)
	if err != nil {
		return nil, fmt.Errorf("start lazy-pages: page server %q: %w", o.PageServer, err)
	}
	if !filepath.IsAbs(o.ImagePath) || (o.WorkPath != "" && !filepath.IsAbs(o.WorkPath)) {
		return nil, fmt.Errorf("start lazy-pages: image path %q and work path %q must be absolute", o.ImagePath, o.WorkPath)
	}
	work := o.WorkPath
	if work == "" {
		work = o.ImagePath
	}
	return r.startDaemon(ctx, "lazy-pages", work, LazyPagesLog,
		"lazy-pages", "--images-dir", o.ImagePath, "--work-dir", work,
		"--page-server", "--address", host, "--port", port)
}

// PageServerOpts configures StartPageServer.
type PageServerOpts struct {
	// ImagePath receives the pages; the rest of the images is shipped by
	// the caller into the same directory. Required, absolute.
	ImagePath string
	// WorkPath receives the daemon's log; ImagePath when empty.
	WorkPath string
	// Address is the "host:port" to listen on (the dump's
	// CheckpointOpts.PageServer).
	Address string
}

// StartPageServer starts `criu page-server` and returns once it listens.
// It receives the memory pages of one non-lazy Checkpoint whose
// PageServer points here and exits when that dump ends. Cancelling ctx
// kills it.
func (r *Runtime) StartPageServer(ctx context.Context, o PageServerOpts) (*Daemon, error) {
	if err := r.CheckCRIU(ctx); err != nil {
		return nil, fmt.Errorf("start page-server: %w", err)
	}
	host, port, err := net.SplitHostPort(o.Address)
	if err != nil {
		return nil, fmt.Errorf("start page-server: address %q: %w", o.Address, err)
	}
	if !filepath.IsAbs(o.ImagePath) || (o.WorkPath != "" && !filepath.IsAbs(o.WorkPath)) {
		return nil, fmt.Errorf("start page-server: image path %q and work path %q must be absolute", o.ImagePath, o.WorkPath)
	}
	work := o.WorkPath
	if work == "" {
		work = o.ImagePath
	}
	return r.startDaemon(ctx, "page-server", work, PageServerLog,
		"page-server", "--images-dir", o.ImagePath, "--work-dir", work,
		"--address", host, "--port", port)
}

// startDaemon runs criu with args plus logging and --status-fd, and waits
// for CRIU's ready byte (or its exit, which is an error with CRIU's
// reason).
func (r *Runtime) startDaemon(ctx context.Context, name, work, logName string, args ...string) (*Daemon, error) {
	criu, err := r.criuPath()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logPath := filepath.Join(work, logName)
	if err := os.Remove(logPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: status pipe: %w", name, err)
	}
	defer rd.Close()
	args = append(args, "-o", logName, "-v4", "--status-fd", "3")
	cmd := exec.CommandContext(ctx, criu, args...)
	cmd.ExtraFiles = []*os.File{wr}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		wr.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	wr.Close()
	d := &Daemon{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.err = cmd.Wait()
		if d.err != nil && out.Len() > 0 {
			d.err = fmt.Errorf("%w: %s", d.err, strings.TrimSpace(out.String()))
		}
	}()
	var b [1]byte
	if n, _ := io.ReadFull(rd, b[:]); n == 1 {
		r.logger().Debug("criu daemon ready", "daemon", name, "pid", cmd.Process.Pid)
		return d, nil
	}
	// CRIU closed the status fd without the ready byte: it has failed.
	return nil, d.Wait(context.Background())
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Done is closed when the daemon has exited.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Wait waits for the daemon to exit and returns its failure with CRIU's
// reason from its log; nil when it exited cleanly. When ctx ends first,
// Wait returns ctx's error and the daemon keeps running.
func (d *Daemon) Wait(ctx context.Context) error {
	select {
	case <-d.done:
	case <-ctx.Done():
		return fmt.Errorf("wait for criu %s: %w", d.name, ctx.Err())
	}
	if d.err == nil {
		return nil
	}
	err := fmt.Errorf("criu %s: %w", d.name, d.err)
	if reason := criuReason(d.logPath); reason != "" {
		err = fmt.Errorf("%w; criu log %s: %s", err, d.logPath, reason)
	}
	return err
}

// Stop kills the daemon if it still runs and waits for it to exit.
func (d *Daemon) Stop() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

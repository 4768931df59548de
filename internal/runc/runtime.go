package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// Runtime drives the runc binary for the containers whose state lives
// under Root (one Root per emulated node). Its exported fields are set
// before first use and not changed afterwards.
//
// A Runtime is safe for concurrent use by multiple goroutines. Calls that
// change one container (Run, Restore, Checkpoint, Kill, Pause, Resume,
// Delete) must be serialized by the caller for that id, as runc has no
// lock across its commands; State and List may be called at any time.
type Runtime struct {
	// Binary is the runc executable; "runc" looked up on PATH when empty.
	Binary string
	// CRIU is the criu executable given to runc and used by the page
	// server daemons; "criu" looked up on PATH when empty.
	CRIU string
	// Shim is edgehop's criu shim (cmd/edgehop-criu, ShimName): runc is
	// given it as its criu, and it runs CRIU (the binary above) for runc.
	// It answers runc's version probe itself and can hold a dump at a
	// Gate. Empty: runc runs CRIU directly, and a Gate holds runc back
	// instead.
	Shim string
	// CRIULogLevel is the level CRIU logs a dump or a restore at, 1
	// (errors) to 4 (every step); 0 leaves runc's, which is 4. It takes
	// the Shim's gate library, which rewrites runc's request (CRIU takes
	// the request's level over its configuration file's).
	CRIULogLevel int
	// Root is runc's state directory (runc --root); required, absolute.
	Root string
	// Log receives a debug record per runc command, an info record per
	// checkpoint and restore, and warnings; nil discards.
	Log *slog.Logger

	mu sync.Mutex
	// streams holds the output copiers of containers this Runtime started
	// or restored, by id, until Delete, a stopping Checkpoint, or Close
	// ends them. Guarded by mu.
	streams map[string]*streams
	shim    shimState
}

// Status is a container's runc status.
type Status string

// The statuses runc reports.
const (
	StatusCreating Status = "creating"
	StatusCreated  Status = "created"
	StatusRunning  Status = "running"
	StatusPaused   Status = "paused"
	StatusStopped  Status = "stopped"
)

// State is what runc reports about one container.
type State struct {
	ID      string    `json:"id"`
	Status  Status    `json:"status"`
	Pid     int       `json:"pid"` // init process, in the host's pid namespace; 0 when stopped
	Bundle  string    `json:"bundle"`
	Rootfs  string    `json:"rootfs"`
	Created time.Time `json:"created"`
}

// stopStreamsLimit bounds how long Delete and Checkpoint wait for a
// container's output pipes to reach end of file after its processes are
// gone, when the caller's context has no earlier deadline.
const stopStreamsLimit = 10 * time.Second

func (r *Runtime) logger() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// runcPath resolves the runc binary.
func (r *Runtime) runcPath() (string, error) {
	name := r.Binary
	if name == "" {
		name = "runc"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("runc binary %q not found (run 'make setup'): %w", name, ErrNotSupported)
	}
	return p, nil
}

// criuPath resolves the criu binary.
func (r *Runtime) criuPath() (string, error) {
	name := r.CRIU
	if name == "" {
		name = "criu"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("criu binary %q not found (run 'make setup'): %w", name, ErrNotSupported)
	}
	return p, nil
}

func (r *Runtime) checkRoot() error {
	if r.Root == "" || !filepath.IsAbs(r.Root) {
		return fmt.Errorf("runc root %q must be an absolute path", r.Root)
	}
	return nil
}

// validID reports whether id can name a directory under Root.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\x00")
}

// stateExists reports whether runc has state for id under Root. runc keeps
// one directory per container holding state.json.
func (r *Runtime) stateExists(id string) bool {
	_, err := os.Stat(filepath.Join(r.Root, id, "state.json"))
	return err == nil
}

// stateDirExists reports whether runc's directory for id may be there,
// even without state.json (a runc killed while it made or removed it):
// only its certain absence is false, so that Delete decides otherwise.
func (r *Runtime) stateDirExists(id string) bool {
	_, err := os.Lstat(filepath.Join(r.Root, id))
	return !errors.Is(err, os.ErrNotExist)
}

// invocation is one runc command.
type invocation struct {
	op   string   // subcommand
	id   string   // container id, appended last; "" for list
	args []string // subcommand flags
	post []string // positional arguments after the id
	// stdio, when set, becomes runc's stdin/stdout/stderr (and so the
	// container's); otherwise both outputs are captured.
	stdio *childStdio
	// extra are inherited as fds 3, 4, ...
	extra []*os.File
	// criu makes runc use the resolved criu binary (--criu).
	criu bool
	// group runs runc in a process group of its own, killed whole when
	// ctx ends: a CRIU restore outliving a killed runc would hold the
	// container (half restored, waiting for pages from a source that
	// gave up) until the agent restarts.
	group bool
	// criuLog is the CRIU log consulted when the command fails.
	criuLog string
	// tmp is a private directory for runc's log (and the caller's pid
	// file); created by exec when empty.
	tmp string
	// cgroups, when set, are cgroup v1 cgroups runc starts in
	// (startIn).
	cgroups []CgroupDir
	// afterResume, when set, is asked once when a detaching runc
	// (start) failed: true when CRIU had resumed the container's tasks
	// before (RestoreOpts.Resumed), so that a container that runs is
	// kept.
	afterResume func() bool
	// pidFromState makes start read the container's pid from runc's
	// state rather than have runc write a pid file, which runc writes
	// after CRIU resumed the tasks and, failing, kills them for.
	pidFromState bool
	// started, when set, is called with runc's pid once it started
	// (with group, also its process group's id).
	started func(pid int)
	// cancel, when set, replaces killing runc when ctx ends; runc is
	// still killed if it has not exited cmdWaitDelay later.
	cancel func() error
	// realIDs, when set, runs runc with these real ids (setpriv), its
	// effective ids and capabilities unchanged.
	realIDs *IDs
	// env is added to runc's environment (which CRIU inherits).
	env []string
}

// cmdWaitDelay is how long a runc command may run on after its context
// ended (and its cancel function ran) before it is killed.
const cmdWaitDelay = 5 * time.Second

// exec runs one runc command and returns its standard output. A failure
// is an *Error carrying runc's messages (from its JSON log, else stderr)
// and CRIU's reason when inv.criuLog is set.
func (r *Runtime) exec(ctx context.Context, inv invocation) ([]byte, error) {
	if err := r.checkRoot(); err != nil {
		return nil, err
	}
	bin, err := r.runcPath()
	if err != nil {
		return nil, err
	}
	tmp := inv.tmp
	if tmp == "" {
		if tmp, err = os.MkdirTemp("", "edgehop-runc-"); err != nil {
			return nil, fmt.Errorf("runc %s %s: %w", inv.op, inv.id, err)
		}
		defer os.RemoveAll(tmp)
	}
	logPath := filepath.Join(tmp, "runc.log")
	args := []string{"--root", r.Root, "--log", logPath, "--log-format", "json"}
	env := inv.env
	if inv.criu {
		criu, err := r.criuPath()
		if err != nil {
			return nil, err
		}
		shim, err := r.shimPath()
		if err != nil {
			return nil, err
		}
		if shim != "" {
			env = append(env, r.shimEnv(ctx, criu)...)
			criu = shim
		}
		args = append(args, "--criu", criu)
	}
	args = append(args, inv.op)
	args = append(args, inv.args...)
	if inv.id != "" {
		args = append(args, inv.id)
	}
	args = append(args, inv.post...)
	if inv.realIDs != nil {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			return nil, fmt.Errorf("runc %s %s: setpriv (util-linux) not found, needed to dump a service running as uid %d: %w",
				inv.op, inv.id, inv.realIDs.UID, ErrNotSupported)
		}
		args = append([]string{"--ruid", strconv.Itoa(inv.realIDs.UID), "--rgid", strconv.Itoa(inv.realIDs.GID),
			"--keep-groups", "--", bin}, args...)
		bin = setpriv
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.WaitDelay = cmdWaitDelay
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	switch {
	case inv.cancel != nil:
		cmd.Cancel = inv.cancel
	case inv.group:
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
	var stdout, stderr *os.File
	if inv.stdio != nil {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = inv.stdio.stdin, inv.stdio.stdout, inv.stdio.stderr
	} else {
		// Files rather than pipes: CRIU inherits runc's stdio, and a CRIU
		// outliving a killed runc must not hold Wait up.
		if stdout, err = os.Create(filepath.Join(tmp, "stdout")); err != nil {
			return nil, fmt.Errorf("runc %s %s: %w", inv.op, inv.id, err)
		}
		defer stdout.Close()
		if stderr, err = os.Create(filepath.Join(tmp, "stderr")); err != nil {
			return nil, fmt.Errorf("runc %s %s: %w", inv.op, inv.id, err)
		}
		defer stderr.Close()
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}
	cmd.ExtraFiles = inv.extra
	start := time.Now()
	var runErr error
	switch {
	case len(inv.cgroups) > 0:
		if runErr = startIn(cmd, inv.cgroups); runErr == nil {
			if inv.started != nil {
				inv.started(cmd.Process.Pid)
			}
			runErr = cmd.Wait()
		}
	case inv.started == nil:
		runErr = cmd.Run()
	default:
		if runErr = cmd.Start(); runErr == nil {
			inv.started(cmd.Process.Pid)
			runErr = cmd.Wait()
		}
	}
	r.logger().Debug("runc", "op", inv.op, "id", inv.id, "args", strings.Join(inv.args, " "),
		"took", time.Since(start), "err", runErr)
	if runErr == nil {
		if stdout == nil {
			return nil, nil
		}
		out, err := os.ReadFile(stdout.Name())
		if err != nil {
			return nil, fmt.Errorf("runc %s %s: read output: %w", inv.op, inv.id, err)
		}
		return out, nil
	}
	e := &Error{Op: inv.op, ID: inv.id, Err: runErr}
	if data, err := os.ReadFile(logPath); err == nil {
		e.Msg = runcLogMessages(data)
	}
	if e.Msg == "" && stderr != nil {
		data, _ := os.ReadFile(stderr.Name())
		e.Msg = strings.Join(strings.Fields(string(data)), " ")
	}
	if ctx.Err() != nil {
		e.Err = errors.Join(ctx.Err(), runErr)
	}
	if inv.criuLog != "" {
		if reason := criuReason(inv.criuLog); reason != "" {
			e.CRIULog, e.CRIUReason = inv.criuLog, reason
		}
	}
	switch inv.op {
	case "state", "kill", "delete", "checkpoint", "pause", "resume":
		if inv.id != "" && !r.stateExists(inv.id) {
			e.Err = ErrNotFound
		}
	}
	return nil, e
}

// Run starts the container id from the bundle directory (runc run
// --detach) and returns the pid of its init process. The container's
// stdio are pipes; the Runtime copies their output into o until the
// container's processes are gone and Delete (or Close) is called.
func (r *Runtime) Run(ctx context.Context, id, bundle string, o IO) (int, error) {
	return r.start(ctx, invocation{op: "run", id: id}, bundle, o)
}

// start runs a detaching runc command (run or restore) with fresh stdio
// pipes and registers their copiers under id on success. On failure it
// removes any runc state the command left behind for an id that had none.
func (r *Runtime) start(ctx context.Context, inv invocation, bundle string, o IO) (pid int, err error) {
	if id := inv.id; id == "" || strings.ContainsAny(id, "/\x00") {
		return 0, fmt.Errorf("runc %s: invalid container id %q", inv.op, id)
	}
	if bundle, err = filepath.Abs(bundle); err != nil {
		return 0, fmt.Errorf("runc %s %s: %w", inv.op, inv.id, err)
	}
	tmp, err := os.MkdirTemp("", "edgehop-runc-")
	if err != nil {
		return 0, fmt.Errorf("runc %s %s: %w", inv.op, inv.id, err)
	}
	defer os.RemoveAll(tmp)
	pidFile := filepath.Join(tmp, "pid")
	inv.tmp = tmp
	inv.args = append(inv.args, "--detach", "--bundle", bundle)
	if !inv.pidFromState {
		inv.args = append(inv.args, "--pid-file", pidFile)
	}

	existed := r.stateExists(inv.id)
	child, st, err := newStreams(o, r.logger(), inv.id)
	if err != nil {
		return 0, fmt.Errorf("runc %s %s: stdio pipes: %w", inv.op, inv.id, err)
	}
	inv.stdio = &child
	_, err = r.exec(ctx, inv)
	child.close()
	if err != nil && inv.afterResume != nil && inv.afterResume() {
		// CRIU resumed the tasks before runc failed: a container that
		// runs is kept (the caller was told it was restored).
		if s, serr := r.State(context.Background(), inv.id); serr == nil && s.Status == StatusRunning && s.Pid > 0 {
			r.logger().Warn("runc failed after CRIU resumed the restored tasks; the container runs", "id", inv.id, "pid", s.Pid, "err", err)
			r.keepStreams(inv.id, st)
			return s.Pid, nil
		}
	}
	if err != nil {
		// runc has exited; whatever it or a half-started container wrote
		// is drained into o.
		st.wait(context.Background(), 2*time.Second)
		if !existed && r.stateDirExists(inv.id) {
			// context.Background: clean up even when ctx is what failed.
			// (A runc killed midway leaves no state.json: Delete copes.)
			if derr := r.Delete(context.Background(), inv.id, true); derr != nil && !errors.Is(derr, ErrNotFound) {
				err = errors.Join(err, derr)
			}
		}
		return 0, err
	}
	if inv.pidFromState {
		var s State
		if s, err = r.State(ctx, inv.id); err == nil {
			pid = s.Pid
		}
	} else {
		var data []byte
		if data, err = os.ReadFile(pidFile); err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		}
	}
	if err != nil {
		// The container runs but we cannot name it: leave it to the
		// caller (State, Delete) rather than guessing.
		err = fmt.Errorf("runc %s %s: read its pid: %w", inv.op, inv.id, err)
	}
	r.keepStreams(inv.id, st)
	return pid, err
}

// keepStreams registers the output copiers of a started container id.
func (r *Runtime) keepStreams(id string, st *streams) {
	r.mu.Lock()
	if r.streams == nil {
		r.streams = make(map[string]*streams)
	}
	old := r.streams[id]
	r.streams[id] = st
	r.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// endStreams waits for the output copiers of id to reach end of file
// (bounded by ctx and stopStreamsLimit) and forgets them.
func (r *Runtime) endStreams(ctx context.Context, id string) {
	r.mu.Lock()
	st := r.streams[id]
	delete(r.streams, id)
	r.mu.Unlock()
	if st != nil {
		st.wait(ctx, stopStreamsLimit)
	}
}

// State returns runc's state of container id, or an error wrapping
// ErrNotFound.
func (r *Runtime) State(ctx context.Context, id string) (State, error) {
	out, err := r.exec(ctx, invocation{op: "state", id: id})
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(out, &s); err != nil {
		return State{}, fmt.Errorf("runc state %s: decode: %w", id, err)
	}
	return s, nil
}

// List returns the state of every container under Root.
func (r *Runtime) List(ctx context.Context) ([]State, error) {
	out, err := r.exec(ctx, invocation{op: "list", args: []string{"--format", "json"}})
	if err != nil {
		return nil, err
	}
	var states []State
	if err := json.Unmarshal(out, &states); err != nil {
		return nil, fmt.Errorf("runc list: decode: %w", err)
	}
	return states, nil
}

// Kill sends sig to the container's init process, or to all its processes
// when all is set.
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	var args []string
	if all {
		args = append(args, "--all")
	}
	_, err := r.exec(ctx, invocation{op: "kill", id: id, args: args, post: []string{strconv.Itoa(int(sig))}})
	return err
}

// Delete removes the container's runc state; force kills a running
// container first. Its output copiers are then waited for (bounded by ctx
// and 10 s) and dropped, so o's writers are no longer used once Delete
// returns. Deleting an unknown id is ErrNotFound, or nil with force (as
// runc does).
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	var args []string
	if force {
		args = append(args, "--force")
	}
	_, err := r.exec(ctx, invocation{op: "delete", id: id, args: args})
	if force && validID(id) && !r.stateExists(id) {
		// A runc killed while creating or restoring leaves its state
		// directory without state.json: runc cannot delete what it
		// cannot load, and refuses a new container of that id.
		// (A restore's CRIU root is still mounted there.)
		dir := filepath.Join(r.Root, id)
		if rerr := linux.UnmountUnder(dir); rerr != nil {
			err = errors.Join(err, rerr)
		} else if rerr := os.RemoveAll(dir); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if err == nil || errors.Is(err, ErrNotFound) {
		r.endStreams(ctx, id)
	}
	return err
}

// RemoveDumped removes what runc left of container id after a dump that
// completed, so the id can be restored: the stopped container of a runc
// stopped before it removed it, or the state directory without
// state.json of one killed while removing it (runc then neither loads
// nor deletes the container, and refuses to restore that id). A
// container gone already is no error; a running or paused one is
// refused, its processes were not dumped.
func (r *Runtime) RemoveDumped(ctx context.Context, id string) error {
	st, err := r.State(ctx, id)
	switch {
	case err == nil && (st.Status == StatusRunning || st.Status == StatusPaused):
		return fmt.Errorf("remove dumped container %s: it is %s, not dumped", id, st.Status)
	case err != nil && !errors.Is(err, ErrNotFound):
		return err
	case err != nil && !validID(id):
		return nil
	case err != nil:
		if !r.stateDirExists(id) {
			return nil // removed, the usual end of a dump
		}
	}
	if err := r.Delete(ctx, id, true); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Pause freezes every process of the container (its freezer cgroup).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	_, err := r.exec(ctx, invocation{op: "pause", id: id})
	return err
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	_, err := r.exec(ctx, invocation{op: "resume", id: id})
	return err
}

// Close stops copying the output of every container this Runtime
// started, without touching the containers. Containers that write to
// their stdout or stderr afterwards get EPIPE (SIGPIPE by default).
func (r *Runtime) Close() error {
	r.mu.Lock()
	all := r.streams
	r.streams = nil
	r.mu.Unlock()
	for _, st := range all {
		st.close()
	}
	return nil
}

// startIn starts cmd in the cgroup v1 cgroups dirs: a thread of its own
// joins them (cgroup v1 moves threads one by one, and a child starts in
// the cgroups of the thread that forked it), starts cmd and goes back to
// the cgroups it came from. A frozen freezer cgroup is left out (a task
// joining it stops); so is one the thread cannot join or whose
// hierarchy its own cgroups do not name, which runc then binds from the
// agent's cgroup, as without dirs. A thread that cannot go back is not
// reused: it ends with its goroutine.
func startIn(cmd *exec.Cmd, dirs []CgroupDir) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid := []byte(strconv.Itoa(linux.Gettid()))
		self, err := os.ReadFile("/proc/thread-self/cgroup")
		if err != nil {
			errc <- err
			return // the thread has joined nothing; it ends unused
		}
		own := ownCgroups(string(self))
		var back []string
		for _, d := range dirs {
			if st, err := os.ReadFile(filepath.Join(d.Dir(), "freezer.state")); err == nil && strings.TrimSpace(string(st)) != "THAWED" {
				continue
			}
			path, ok := own[d.Hierarchy]
			if !ok {
				continue // cannot go back: left out
			}
			if os.WriteFile(filepath.Join(d.Dir(), "tasks"), tid, 0) == nil {
				back = append(back, filepath.Join(d.Point, path))
			}
		}
		errc <- cmd.Start()
		for _, from := range back {
			if os.WriteFile(filepath.Join(from, "tasks"), tid, 0) != nil {
				return // still in a container's cgroup: ends here
			}
		}
		runtime.UnlockOSThread()
	}()
	return <-errc
}

// leaveCgroups moves process pid, which startIn started in the cgroups
// dirs, to this process's own cgroups of those hierarchies.
func leaveCgroups(pid int, dirs []CgroupDir) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return
	}
	own := ownCgroups(string(self))
	for _, d := range dirs {
		if path, ok := own[d.Hierarchy]; ok {
			_ = os.WriteFile(filepath.Join(d.Point, path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		}
	}
}

// ownCgroups reads /proc/PID/cgroup's lines ("id:controllers:path") into
// each cgroup v1 hierarchy's path, keyed as CgroupDir.Hierarchy
// ("cpu,cpuacct", "systemd" for "name=systemd"); the cgroup v2 line,
// whose controllers are empty, is left out.
func ownCgroups(self string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(self, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue
		}
		out[strings.TrimPrefix(f[1], "name=")] = f[2]
	}
	return out
}

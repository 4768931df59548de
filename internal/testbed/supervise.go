package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// Proc is one long-running process of a testbed, started by the
// supervisor inside a namespace.
type Proc struct {
	Name    string   `json:"name"`
	NetNS   string   `json:"netns"`         // namespace path
	Args    []string `json:"args"`          // argv, argv[0] the binary
	Env     []string `json:"env,omitempty"` // added to the supervisor's environment
	Log     string   `json:"log"`
	PIDFile string   `json:"pid_file"`
}

func (st *State) procsFile() string { return filepath.Join(st.Dir, "procs.json") }

// startSupervisor writes the process list and starts the supervisor, a
// detached process that starts every Proc as its child and, as the child
// subreaper of everything below it (agents, runc, containers), reaps them.
// Machines whose init does not reap orphans would otherwise collect a
// zombie for every process a testbed ever ran.
func startSupervisor(st *State, binary string, procs []Proc) error {
	b, err := json.MarshalIndent(procs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(st.procsFile(), b, 0o644); err != nil {
		return err
	}
	return spawn("", filepath.Join(st.Dir, "supervisor.log"), filepath.Join(st.Dir, "supervisor.pid"),
		binary, "testbed", "supervise", "--procs", st.procsFile())
}

// Supervise runs the supervisor: it becomes a child subreaper, starts the
// listed processes and reaps every child until SIGTERM, when it stops them
// and returns; SIGUSR1 stops the restarts ('testbed down' sends it
// first). A listed process that dies is started again: after 300 ms,
// doubling up to 10 s while it keeps dying within 10 s of its start. An
// agent that restarts settles the migrations a crash interrupted from its
// journal.
func Supervise(ctx context.Context, procsFile string) error {
	b, err := os.ReadFile(procsFile)
	if err != nil {
		return err
	}
	var procs []Proc
	if err := json.Unmarshal(b, &procs); err != nil {
		return fmt.Errorf("parse %s: %w", procsFile, err)
	}
	if err := linux.SetChildSubreaper(); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	restarting := true
	defer signal.Stop(sigs)
	st := make([]procState, len(procs))
	byPID := map[int]int{}
	start := func(i int) error {
		pid, err := startProc(procs[i])
		if err != nil {
			return err
		}
		byPID[pid] = i
		st[i].started = time.Now()
		st[i].due = time.Time{}
		return nil
	}
	for i := range procs {
		if err := start(i); err != nil {
			return fmt.Errorf("start %s: %w", procs[i].Name, err)
		}
	}
	for {
		var timeout <-chan time.Time
		if next := nextDue(st); !next.IsZero() {
			timeout = time.After(time.Until(next))
		} else {
			timeout = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			stopAll(procs)
			return nil
		case s := <-sigs:
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				stopAll(procs)
				return nil
			}
			if s == syscall.SIGUSR1 {
				// 'testbed down' is under way: reap, never restart.
				restarting = false
			}
		case <-timeout:
		}
		for _, pid := range reapAll() {
			i, ok := byPID[pid]
			if !ok {
				continue
			}
			delete(byPID, pid)
			if !restarting {
				continue
			}
			st[i].backoff = restartBackoff(st[i])
			st[i].due = time.Now().Add(st[i].backoff)
			fmt.Fprintf(os.Stderr, "%s supervisor: %s (pid %d) exited; restarting in %s\n", time.Now().UTC().Format(time.RFC3339Nano), procs[i].Name, pid, st[i].backoff)
		}
		for i := range st {
			if restarting && !st[i].due.IsZero() && !time.Now().Before(st[i].due) {
				if err := start(i); err != nil {
					fmt.Fprintf(os.Stderr, "%s supervisor: restart %s: %v\n", time.Now().UTC().Format(time.RFC3339Nano), procs[i].Name, err)
					st[i].backoff = restartBackoff(st[i])
					st[i].due = time.Now().Add(st[i].backoff)
				} else {
					fmt.Fprintf(os.Stderr, "%s supervisor: %s restarted\n", time.Now().UTC().Format(time.RFC3339Nano), procs[i].Name)
				}
			}
		}
	}
}

// procState is what the supervisor knows of one process.
type procState struct {
	started time.Time
	due     time.Time // restart due (zero: running)
	backoff time.Duration
}

// Restart backoff bounds.
const (
	firstBackoff = 300 * time.Millisecond
	maxBackoff   = 10 * time.Second
	stableAfter  = 10 * time.Second
)

// restartBackoff is the wait before the next start of a process that
// exited: the first one after a stable run is short, each quick death
// doubles it.
func restartBackoff(p procState) time.Duration {
	if p.backoff == 0 || time.Since(p.started) > stableAfter {
		return firstBackoff
	}
	return min(2*p.backoff, maxBackoff)
}

func nextDue(st []procState) time.Time {
	var next time.Time
	for _, p := range st {
		if !p.due.IsZero() && (next.IsZero() || p.due.Before(next)) {
			next = p.due
		}
	}
	return next
}

func startProc(p Proc) (int, error) {
	lf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer lf.Close()
	cmd := linux.Command(p.NetNS, p.Args[0], p.Args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	// Reaped by reapAll, never by cmd.Wait. The file appears whole:
	// readers take an empty or partial one for a dead process.
	return cmd.Process.Pid, linux.WriteFileAtomic(p.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// reapAll collects every exited child (direct or adopted) and returns
// their pids.
func reapAll() []int {
	var pids []int
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || errors.Is(err, syscall.ECHILD) || err != nil {
			return pids
		}
		pids = append(pids, pid)
	}
}

// stopAll terminates the listed processes, then reaps until no child is
// left or a deadline passes.
func stopAll(procs []Proc) {
	for _, p := range procs {
		if b, err := os.ReadFile(p.PIDFile); err == nil {
			if pid, err := strconv.Atoi(string(b)); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.ECHILD) {
			return
		}
		if pid <= 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

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
// and returns.
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
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	for _, p := range procs {
		if err := startProc(p); err != nil {
			return fmt.Errorf("start %s: %w", p.Name, err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			stopAll(procs)
			return nil
		case s := <-sigs:
			reapAll()
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				stopAll(procs)
				return nil
			}
		case <-time.After(time.Second):
			reapAll()
		}
	}
}

func startProc(p Proc) error {
	lf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	cmd := linux.Command(p.NetNS, p.Args[0], p.Args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Reaped by reapAll, never by cmd.Wait. The file appears whole:
	// readers take an empty or partial one for a dead process.
	return linux.WriteFileAtomic(p.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// reapAll collects every exited child (direct or adopted).
func reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || errors.Is(err, syscall.ECHILD) || err != nil {
			return
		}
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

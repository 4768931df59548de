//go:build failpoints

package agent

import (
	"os"
	"path/filepath"
	"syscall"
)

// failpoint makes the agent exit at once, as a crash would, when
// <state>/failpoint-<name> exists: crash-recovery tests create it to kill
// the agent at a moment no outside observer can hit (between two journal
// writes). The file is removed first, so the restarted agent goes on.
// Only a build with the tag failpoints has it (the product build's is a
// no-op, failpoint.go); the check is one failed unlink.
func (a *Agent) failpoint(name string) {
	if os.Remove(filepath.Join(a.cfg.StateDir, "failpoint-"+name)) == nil {
		a.log.Error("failpoint reached: exiting as a crash would", "failpoint", name)
		os.Exit(137)
	}
}

// failpointStop stops the agent (SIGSTOP to itself), as a hang would, when
// <state>/failpoint-<name> exists (removed first): its connections stay
// open and its kernel acknowledges, but it says nothing until a SIGCONT.
func (a *Agent) failpointStop(name string) {
	if os.Remove(filepath.Join(a.cfg.StateDir, "failpoint-"+name)) == nil {
		a.log.Error("failpoint reached: stopping as a hang would", "failpoint", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
}

// failpointArmed reports whether failpoint name would fire (a stat).
func (a *Agent) failpointArmed(name string) bool {
	_, err := os.Stat(filepath.Join(a.cfg.StateDir, "failpoint-"+name))
	return err == nil
}

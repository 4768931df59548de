//go:build !failpoints

package agent

// Failpoints are compiled in only with the build tag failpoints
// (failpoint_enabled.go, the Makefile's bin/edgehop-failpoints), the
// agent the crash-recovery tests run. In this, the product build, a
// failpoint never fires whatever the state directory holds: no file can
// make the agent exit.

// failpoint does nothing: failpoints are not built in.
func (a *Agent) failpoint(string) {}

// failpointArmed reports false: failpoints are not built in.
func (a *Agent) failpointArmed(string) bool { return false }

// failpointStop does nothing: failpoints are not built in.
func (a *Agent) failpointStop(string) {}

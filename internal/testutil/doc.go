// Package testutil holds helpers for edgehop's tests: privilege and feature
// probes that turn into skips with a stated reason, per-test unique names,
// network namespaces removed on cleanup, and a test binary re-run as a
// child process to kill at a chosen point. Production code never imports it.
package testutil

// Package testutil holds helpers for edgehop's tests: privilege and feature
// probes that turn into skips with a stated reason, per-test unique names,
// and network namespaces removed on cleanup. Production code never imports it.
package testutil

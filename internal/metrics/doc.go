// Package metrics owns the Prometheus metrics an agent serves on its
// operator API (GET /metrics on the unix socket): migrations by role,
// strategy and outcome, the frozen window and per-phase durations, bytes
// on the wire, held packets, containers, running migrations and crash
// recoveries. The agent feeds it migration results; the registry is the
// agent's own (no global state), with Go runtime and process collectors.
//
// Durations and sizes of a migration are recorded from its source's
// result only, so that a sum over all agents counts each migration once;
// outcomes are counted on both sides, labelled by role.
package metrics

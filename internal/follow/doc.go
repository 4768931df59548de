// Package follow is the follow-the-user experiment behind `edgehop demo`
// and `edgehop bench follow` (H-Container Sec. 7, Fig. 17): a testbed of
// regions, access points and nodes; a user walking across it with a real
// redis client running the whole time against three copies of one redis —
// one the controller migrates to follow the user under a policy, one
// fixed at the origin, one fixed at the destination — while the emulated
// links follow the distances (package world). It reports every handoff and
// migration, the throughput and latency over time of each copy, and
// verifies every key afterwards; the report is JSON and an HTML page.
package follow

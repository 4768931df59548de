// Package journal persists the phase of every migration a node takes part
// in: one append-only log per migration, a checksummed JSON line per phase,
// each made durable (fdatasync; the directory fsynced when the log is new)
// before the agent acts on the phase. A line torn by a crash fails its
// checksum, so the last phase made durable is what a restart reads. An agent that restarts reads it back to settle what a crash
// interrupted (migration.RecoverSource, migration.RecoverDest), and peers
// ask for a migration's phase through the agent's peer API: the source's
// entry Committed is the commit point of a migration.
//
// It must not decide anything: the migration package does. It reads only
// files it wrote, and validates every record it reads.
package journal

// Package policy is tier 2 of the double-tier migration: when and where a
// service moves to follow its user. Each service chooses a policy — a
// latency threshold (ARNAB, Foglets), a regional access change with a hop
// limit (ARNAB Sec. 4.3), Teka et al.'s neighbour database and Algorithm
// 2, a throughput threshold (H-Container), or the performance model
// choosing target and strategy for a downtime target — and every policy
// is damped the same way: a node that stopped heartbeating is never a
// target, nothing moves within a minimum dwell time of the last
// migration, a target must beat the serving node by a hysteresis
// margin, and a return to the node the service last left must have been
// wanted without a break for a sustain time (the ping-pong guard: a user
// wandering on a border does not drag the service back and forth). A
// group split across two nodes (a member moved alone) is decided by
// Reunite instead: after ReuniteAfter, its members on one node join those
// on the node nearer the user. Decide and Reunite are pure: they read a
// View and return a Decision with its inputs and reason; the controller
// does the I/O.
package policy

// Package controller makes services follow their users. It holds the
// topology (regions, access points, nodes, links), the users with their
// positions and tier-1 attachment, the services with their tier-2
// policies, and the agents' heartbeats and measurements; it keeps that
// state and the full history (events, decisions with their inputs,
// handoffs, migrations with their phases) in a store.Store.
//
// Engine is the deterministic part: positions in, radio.Decide for tier 1;
// measurements in, policy.Decide for tier 2. Controller does the I/O: it
// applies handoffs through the Access seam (the testbed moves a client's
// virtual AP between AP namespaces), starts migration jobs on the source
// node's agent and records what they report. A service that is a group
// or pod (Engine.Groups, from the heartbeats) moves as one: its members'
// jobs are one migration record (migration.UnitResult); reported whole
// by two live nodes (a member moved alone), it is Split and its policy
// does not run until one node alone reports it again; split across two
// nodes for its policy's ReuniteAfter, policy.Reunite moves the members
// on one node to the other, the one nearer the user. The model
// predicts a migration from the memory the service's agent measures
// (Engine.Memory; a group's is its members' sum), the operator's declared
// memory only until one is reported. Handler serves the operator API
// (described at /openapi.json), the dashboard and a server-sent event
// stream, each request checked by Auth: the controller's token (kept by
// LoadOrCreateToken in a file of mode 0600 beside the DB) as a bearer
// token or the cookie GET /login sets, a Host naming the listener (DNS
// rebinding), no foreign Origin and a JSON body (a web page's no-cors
// POST); AgentHandler serves the agents' heartbeats over mutual TLS.
//
// It must not reach into nodes: agents own their containers.
package controller

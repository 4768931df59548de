// Package store keeps the controller's state and full history in an
// embedded SQL database (pure-Go SQLite, modernc.org/sqlite, since the
// build is CGO-free): the current records (topology, nodes, users,
// services), one row each by kind and key, and an append-only history of
// events, decisions with their inputs, handoffs and migrations with their
// phases. Store is the seam a replicated store would implement; SQLite is
// the one implementation. It interprets nothing it stores.
package store

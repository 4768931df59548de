// Package api defines the JSON types of the agent's HTTP API and a small
// client for it, shared by the CLI, peers and tests. It holds no logic
// beyond encoding, transport and turning error responses into Go errors.
package api

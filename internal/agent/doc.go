// Package agent is the edgehop node agent: it owns one node's containers
// (through runc), its overlay networking (through netplane) and its state
// directory, and serves an HTTP/JSON API on a local unix socket (operators,
// the CLI) and on the underlay (peer agents). Nodes share nothing but the
// network: the agent reads and writes only its own state directory and the
// image cache it imports from.
//
// It must not reach into another node's directories or namespaces.
package agent

// Package world is the physical world of a testbed: users' devices move
// along mobility traces, their positions reach the controller as a
// device's location reports would, and the emulated links follow the
// distances — the access link's delay and rate the distance to the AP the
// user is attached to, each node's link delay the distance from the user
// to that node (H-Container's emulation: latency rising 1 ms per step as
// the user walks away). The controller never sees a trace; its policies
// act on what the agents measure through these links.
package world

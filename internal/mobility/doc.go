// Package mobility describes how users move: traces of waypoints walked
// at given speeds (with pauses), and the random-waypoint model, both as
// plain data with Position(t). The testbed and the demo replay them; the
// controller never reads a trace, only the positions and measurements a
// user's device reports. Pure: no I/O, no clock.
package mobility

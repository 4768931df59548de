// Package radio is tier 1 of ARNAB's double-tier migration: the signal a
// user's device is heard with at each access point (log-distance path
// loss) and the infrastructure's handoff decision (ARNAB Sec. 4.1, steps
// 3-4: the serving AP reports when the signal falls below a threshold,
// and the controller moves the user's virtual AP to the best candidate).
// A hysteresis margin keeps a user on the border between two APs from
// bouncing between them. Pure: no I/O.
package radio

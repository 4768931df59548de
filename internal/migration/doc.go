// Package migration holds the plain description of a live migration: the
// strategies, the request, the phase timer and the result every migration
// records (phases, CRIU statistics, bytes on the wire), and the messages the
// source and destination agents exchange. It does no I/O; the agents drive
// the steps and the model package consumes the results.
package migration

// Package probe is edgehop's continuity probe: a line protocol whose every
// reply proves that no byte of a TCP connection was lost, duplicated or
// reordered, and a client that measures how long a migrating service was
// silent.
//
// Protocol: for every newline-terminated line the server receives on a
// connection it replies with one line
//
//	<total bytes received on this connection so far> <CRC-32 of those bytes>\n
//
// where the CRC is IEEE CRC-32 (as Python's zlib.crc32) in 8 lowercase hex
// digits, and "so far" counts up to and including the newline that ends the
// request. The reply therefore depends only on the byte stream, never on how
// TCP split or merged it.
//
// The server half runs inside containers that CRIU checkpoints and restores
// with --tcp-established, so it uses plain blocking I/O per connection, no
// timers, no deadlines and no wall clock, writes nothing after its
// startup line, and listens with plain TCP (Listen), never Go's default
// MPTCP, which CRIU cannot dump. The client half runs on the test side; it must not touch
// namespaces itself (callers pass a Dialer or run it inside one).
package probe

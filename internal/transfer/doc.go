// Package transfer moves migration state between two edgehop agents over
// one connection: small typed JSON control messages for the migration RPC,
// and bulk streams (a directory tree such as CRIU's checkpoint images, or a
// single object of unknown size produced while it is read, such as memory
// pages).
//
// The protocol is built for the frozen window of a live migration: the
// sender never waits for the receiver (no per-chunk acknowledgements), reads
// the next chunk while the previous one is on the wire, and writes large
// frames. Every frame carries a CRC-32C; every stream ends with a summary
// (counts, bytes, an xxhash64 digest of the content) that the receiver
// checks. A directory is received into a temporary sibling and renamed into
// place only once the summary matches, so a failed transfer leaves nothing
// behind. Chunks may be zstd-compressed, always or when a probe shows that
// compression raises throughput over the declared link rate: at zstd's
// fastest level, or at its default level on a link at least 40 times
// slower than the fastest level runs here, where the wire sets the pace
// and the denser output shortens it.
//
// With SendOptions.Overlay a directory stream carries everything an
// overlayfs upper layer needs to be mounted again elsewhere: whiteouts and
// other device nodes, FIFOs, sockets, hard links (each inode once) and
// extended attributes (opaque directories and overlayfs' other markers,
// file capabilities, ACLs).
//
// A Tunnel carries plain TCP connections (CRIU's page traffic in
// post-copy) across an authenticated agent connection: the destination
// listens locally and opens one agent connection per client, the source
// agent checks the request (ServeTunnel) and splices the connection to its
// local target, with half-close passed through both ways. Each direction
// ends with an explicit marker, so an agent that died (its kernel's plain
// FIN) is told from a finished stream and the target's connection is
// reset rather than ended.
//
// Every blocking call takes a context; when it ends, the connection is
// closed so the call returns at once, which is how a migration aborts when
// its peer dies. Dial and Listener add mutually authenticated TLS (package
// pki) and report the peer's node name. A Listener runs its handshakes
// concurrently, outside any lock, and bounds those under way from one
// source address and in all, so that a host of the underlay that connects
// and stays silent holds up no migration.
//
// This package does not know what a migration is: the lead's migration code
// defines the message types and the order of streams, and decides which
// tunnel requests to accept. It does not retry or resume a broken transfer.
// The file-system calls os does not offer (mknod, extended attributes,
// symlink times) go through package linux.
package transfer

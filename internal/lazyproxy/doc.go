// Package lazyproxy carries the lazy pages of post-copy and hybrid
// migrations between CRIU's page server and its lazy-pages daemon: ahead of
// the daemon, and for hybrid (live pre-copy rounds, then post-copy for the
// rest) without sending again what the rounds already left on the
// destination.
//
// CRIU's lazy-pages daemon on the destination asks a page server for each
// page range it needs. Here it asks ServeDest, on the destination, which
// relays the request through the agents' authenticated tunnel to
// ServeSource on the source, which asks CRIU's page server. For each page
// of the reply the source proxy checks, by hash, whether the destination
// holds exactly that content at that address (the rounds' bookkeeping,
// precopy.Source.HoldsPage) and sends a one-byte "held" flag instead of the
// page; the destination proxy fills held pages from its store
// (precopy.Store.ReadHeldPage) and hands CRIU the reply it expects. The
// check is against the frozen content CRIU serves, so a page that changed
// after the last round is sent whole: correctness never rests on the
// rounds.
//
// ServePrefetch (post-copy, and hybrid when the dump's lazy runs are known)
// pulls every lazy page ahead of the daemon, in address order as the daemon
// takes them, from the moment the state has arrived (while CRIU restores),
// and answers the daemon from what arrived; the pages around a fault go
// first, and little is in flight while faults come. The runs come from the
// source's pagemaps: they are checked (aligned, disjoint, at most
// PrefetchConfig.MaxPages pages in all) and kept as runs, never as one
// entry per page.
package lazyproxy

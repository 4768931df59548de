// Package blockdiff sends a large file that changed as the blocks that
// changed, when the receiver holds an earlier copy of it.
//
// The sender records, while it sends a file whole (an Index's Writer,
// fed with the bytes exactly as sent, such as transfer.SendOptions.Tee),
// a hash of each BlockSize block. Later, Index.Diff reads the file again
// and lists the blocks whose content differs from what was sent, merged
// into ranges, with the file's new size: a Patch. The receiver checks a
// Patch against its own limits (Patch.Check) and applies it to its copy
// (Apply) from the changed blocks' data, sent in the patches' order.
//
// The hashes never leave the sender: they are maphash's, keyed with a
// seed drawn at random per Index, so a file's content (which may be a
// stranger's input) cannot be chosen to make a changed block look
// unchanged. Files smaller than MinSize are not indexed: they are sent
// whole.
//
// This package reads and writes files it is handed; it does not walk
// trees, define messages or touch the network.
package blockdiff

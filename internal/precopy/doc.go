// Package precopy moves a container's memory to the destination while the
// container runs, without kernel dirty tracking (this kernel has no
// soft-dirty bits, so `criu pre-dump` is impossible), and then sends only
// what the frozen dump adds.
//
// Live rounds (Source.Round): the source reads every process's anonymous
// memory with process_vm_readv (the pages CRIU would dump: found with the
// PAGEMAP_SCAN ioctl, and for shared memory, which CRIU dumps whole
// whether or not a process mapped a page, with SEEK_DATA on the object
// through /proc/PID/map_files), hashes each 4 KiB page under the
// migration's secret key (HighwayHash-64, pagehash.go: the service's
// clients write its memory and must not be able to aim a page at the hash
// of one the destination holds) and sends the pages whose hash differs
// from what the destination holds, as records of (namespace pid, address,
// data) with a checksum per record.
// Zero pages go as a flag, and a page whose content the destination
// already holds at another address goes as a copy from there. The
// source keeps a copy of the pages it sent as data, up to a bound
// (shadow.go, the pages that changed after the first round first): a
// page that changed in few of its words goes as its XOR with what the
// destination holds, which the stream's compression reduces to little
// more than those words. The
// destination (Store) keeps one sparse file per namespace pid, the page
// at address a stored at offset a. The source remembers the hash of
// every page the destination holds. ShouldStop decides when to stop the
// rounds.
//
// The final round (Source.SendFinal, Store.RebuildFinal) sends CRIU's
// dump of the frozen container: each pages-*.img file page by page in its
// order (mapped, when larger than a read's chunk, so that its pages are
// hashed and encoded from the page cache without a copy; the index of
// pages held elsewhere is looked up only for pages not held at their own
// address), as "you hold it at (pid, address)", the data or its XOR with
// what the destination holds there, then every other
// image as it is. The destination writes the pages files from the delta
// and checks each against the source's digest, taken over all its pages;
// the pages it holds at their own address stay in the store, which the
// image directory names as its parent (parent.go: CRIU's incremental
// dumps, the pagemap's PE_PARENT entries), so the frozen window neither
// copies them nor frees the store's copies, and the images describe the
// dump's memory page for page. With a
// DumpWatch (inotify on the image directory) the pages go while CRIU
// still dumps: each process's pages image as soon as CRIU has closed it
// and its pagemap, the rest once the dump is done (an image sent early
// must then be unchanged); a dump that fails ends the stream with an
// abort. Correctness does not depend on the rounds: a page that changed
// during or after a round differs from the dump and is sent; the rounds
// only decide how much is left to send.
//
// This package reads processes and writes its store; it does not freeze,
// dump or restore anything (the caller runs CRIU), does not define the
// migration's messages (the caller tells the destination which call comes
// next), and reaches the kernel only through package linux.
package precopy

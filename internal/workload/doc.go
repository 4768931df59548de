// Package workload is the core of DPRGen, the dirty page rate generator of
// COAT (Calagna et al., Sec. IV-A), and of ARNAB's "RAM simulation"
// (Abdullaziz et al., Sec. 6.1): a process that holds a state of M bytes in
// a circular buffer of σ = 4096-byte pages and dirties R pages per second.
//
// "DPRGen implements the MS state as a circular buffer of size M bytes
// whose content is continuously, yet properly, updated to achieve a given
// value of dirty page rate R. […] DPRGen sequentially selects N_R = R·ΔT
// pages over an arbitrary time interval ΔT, and, in each of them, modifies
// some bytes by replacing them with random values. […] DPRGen can yield any
// discrete value of target dirty page rate, ranging from R_min = 1 page/ΔT
// to R_max = ⌊M/σ⌋/ΔT."
//
// Unlike the paper's tool, this one verifies its own memory: the content of
// every page is a pure function of (seed, page index, write version)
// (FillPage), the versions are tracked beside the buffer, and Memory.Check
// recomputes every page, so a checkpoint/restore that loses, corrupts or
// resurrects a stale copy of any page is detected. Server answers the
// check over a line protocol on TCP; Client asks it.
//
// Pacer keeps the dirty rate without wall-clock assumptions that break
// across a freeze: after a gap (a checkpoint, a migration) it resumes at
// the rate instead of catching up on the writes it missed.
//
// The package does no I/O besides the listener and connections its callers
// hand to Server and Client; it never prints. cmd/dprgen wires it into the
// static program of the "dprgen" image.
package workload

package linkemu

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
)

// tbfHandle is the handle of the root tbf that Shape installs, so that it
// can tell its own qdisc from others.
var tbfHandle = netlink.MakeHandle(0xe4, 0)

// ErrBadRate is returned (wrapped) for a rate Shape cannot configure.
var ErrBadRate = errors.New("bad link rate")

// MinRate and MaxRate bound the rates Shape accepts, in bits/s.
const (
	MinRate = 64_000
	MaxRate = 1_000_000_000_000
)

const (
	// gsoMax bounds the size tbf sees for one packet from a veth: a GSO/TSO
	// super-packet of 64 KiB of payload, plus the headers of its up to 45
	// segments, which tbf counts.
	gsoMax = 72 << 10
	// burstTime and queueTime size tbf for a rate: the bucket holds
	// burstTime worth of bytes, the queue behind it queueTime worth.
	burstTime = 2 * time.Millisecond
	queueTime = 20 * time.Millisecond
)

// TBFSizes returns the bucket size (burst) and the queue limit, in bytes,
// that Shape uses for rate bits/s:
//
//	burst = max(rate/8 × 2 ms rounded up to a multiple of 64 KiB, 72 KiB)
//	limit = max(rate/8 × 20 ms, 2 × 72 KiB)
//
// 1 Gbit/s: burst 256 KiB, limit 2.5 MB (20 ms); 100 Mbit/s: 72 KiB and
// 250 kB (20 ms); 10 Mbit/s: 72 KiB and 144 KiB (118 ms of queue).
//
// The floors come from GSO/TSO: a veth hands tbf super-packets of up to
// 64 KiB. A bucket smaller than one makes tbf split it into MTU-sized
// segments, which then each cross the NFQUEUE daemon: at 100 Mbit/s with a
// 25 kB bucket, the tests under the race detector on a loaded 2-core
// machine got 49–57 Mbit/s, with the 72 KiB floor 95.6 Mbit/s. A queue
// smaller than one super-packet drops it outright.
// The price is burstiness at low rates: an idle 10 Mbit/s link can send
// 72 KiB at once (59 ms worth).
func TBFSizes(rate uint64) (burst, limit uint32) {
	bps := rate / 8
	b := bps * uint64(burstTime) / uint64(time.Second)
	b = max((b+64<<10-1)&^(64<<10-1), gsoMax)
	q := max(bps*uint64(queueTime)/uint64(time.Second), 2*gsoMax)
	return uint32(min(b, 1<<30)), uint32(min(q, 1<<31))
}

// Shape sets the egress rate of the interface ifName, in the namespace of
// h, to rate bits/s with a root tbf qdisc, changing an existing one in place
// (packets queued in it are kept). Rate 0 removes the shaping.
func Shape(h *netlink.Handle, ifName string, rate uint64) error {
	link, err := h.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("shape %s: %w", ifName, err)
	}
	if rate == 0 {
		if err := unshape(h, link); err != nil {
			return fmt.Errorf("unshape %s: %w", ifName, err)
		}
		return nil
	}
	if rate < MinRate || rate > MaxRate {
		return fmt.Errorf("shape %s: %w: %d bit/s outside [%d, %d]", ifName, ErrBadRate, rate, uint64(MinRate), uint64(MaxRate))
	}
	burst, limit := TBFSizes(rate)
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: link.Attrs().Index,
			Handle:    tbfHandle,
			Parent:    netlink.HANDLE_ROOT,
		},
		Rate:   rate / 8,
		Limit:  limit,
		Buffer: netlink.Xmittime(rate/8, burst),
	}
	if err := h.QdiscReplace(q); err != nil {
		return fmt.Errorf("shape %s to %d bit/s: %w", ifName, rate, err)
	}
	return nil
}

// ShapedRate returns the rate in bits/s of the tbf Shape installed on
// ifName, or 0 when there is none.
func ShapedRate(h *netlink.Handle, ifName string) (uint64, error) {
	link, err := h.LinkByName(ifName)
	if err != nil {
		return 0, fmt.Errorf("shaped rate of %s: %w", ifName, err)
	}
	qs, err := h.QdiscList(link)
	if err != nil {
		return 0, fmt.Errorf("shaped rate of %s: %w", ifName, err)
	}
	for _, q := range qs {
		if t, ok := q.(*netlink.Tbf); ok && t.Attrs().Parent == netlink.HANDLE_ROOT {
			return t.Rate * 8, nil
		}
	}
	return 0, nil
}

// unshape deletes a root tbf from link; other root qdiscs are left alone.
func unshape(h *netlink.Handle, link netlink.Link) error {
	qs, err := h.QdiscList(link)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if _, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
			return h.QdiscDel(q)
		}
	}
	return nil
}

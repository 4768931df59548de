package netplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/edgehop/edgehop/internal/linux"
)

// SendOverlay sends each packet to the container whose MAC is to through
// the overlay, as its sender's frame: it leaves on the VXLAN device, whose
// forwarding entry for to decides the node (a migrated service's new
// one). The source of a migration forwards this way the connection
// requests it held, so that they reach the service where it now runs
// without waiting for the clients' retransmissions.
func (p *Plane) SendOverlay(to net.HardwareAddr, pkts []Packet) error {
	if len(pkts) == 0 {
		return nil
	}
	vx, err := p.h.LinkByName(VXLANName)
	if err != nil {
		return fmt.Errorf("overlay device: %w", err)
	}
	var s *linux.FrameSender
	open := func() (err error) {
		s, err = linux.OpenFrameSender(vx.Attrs().Index, linux.EtherTypeIPv4, to)
		return err
	}
	if p.ns != "" {
		err = linux.InNetNS(p.ns, open)
	} else {
		err = open()
	}
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer s.Close()
	var errs []error
	frame := make([]byte, 0, 1514)
	for _, pk := range pkts {
		if len(pk.From) != 6 || len(pk.IP) < 20 || len(pk.IP) > OverlayMTU {
			errs = append(errs, fmt.Errorf("packet of %d bytes from %v: not a forwardable IPv4 packet", len(pk.IP), pk.From))
			continue
		}
		frame = append(frame[:0], to...)
		frame = append(frame, pk.From...)
		frame = binary.BigEndian.AppendUint16(frame, linux.EtherTypeIPv4)
		frame = append(frame, pk.IP...)
		if err := s.Send(frame); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

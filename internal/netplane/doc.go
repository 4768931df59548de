// Package netplane owns a node's data-plane networking: the container
// bridge, the VXLAN overlay device (learning off), its forwarding database,
// and each container's network namespace and veth with a stable overlay IP
// and MAC. All work is done in-process over netlink (no `ip` processes), so
// the network-switch steps of a migration stay in the millisecond range.
//
// Holders keep a migrating service's packets in the kernel (NFQUEUE):
// Hold, at the destination, every packet until the restore; HoldNew, at
// the source, connection requests from just before the freeze, so the
// dump finds no half-made connection (Pending counts those in their
// handshake or in an accept queue, through sock_diag); SendOverlay
// forwards those requests to the service's new node.
//
// GuardVTEP lets VXLAN in only from the overlay's other VTEPs (an
// iptables chain): a VXLAN device takes frames from any sender.
//
// A Plane acts on one network namespace through a netlink handle. It must
// not know about containers' lifecycles, images or the testbed.
package netplane

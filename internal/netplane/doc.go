// Package netplane owns a node's data-plane networking: the container
// bridge, the VXLAN overlay device (learning off), its forwarding database,
// and each container's network namespace and veth with a stable overlay IP
// and MAC. All work is done in-process over netlink (no `ip` processes), so
// the network-switch steps of a migration stay in the millisecond range.
//
// A Plane acts on one network namespace through a netlink handle. It must
// not know about containers' lifecycles, images or the testbed.
package netplane

// Package ping measures round-trip times with ICMP echo, from the network
// namespace of the calling process (an agent measures from its node):
// RTTs to the node's neighbours (Teka et al.'s possible neighbour
// database) and to the devices of the users its services follow. It needs
// a raw socket (root). It decides nothing.
package ping

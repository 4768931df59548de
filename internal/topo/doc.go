// Package topo is the plain description of an edge deployment the
// controller manages: regions, access points and edge nodes with their
// positions on a plane (metres), the links between regions, and the
// distances and hop counts policies reason with. It is data and pure
// functions only: no I/O, nothing live.
package topo

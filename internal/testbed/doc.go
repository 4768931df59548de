// Package testbed brings up, describes and tears down an emulated edge
// network on one machine: a core namespace that is the underlay router and
// the clients' access point (overlay gateway), one namespace per edge node
// and per mobile client, each joined to the core by an emulated link
// (bandwidth, one-way delay, jitter, loss), and an edgehop agent per node.
//
// The testbed creates nothing in the root network namespace: every link is
// created directly inside the testbed's namespaces, so several testbeds (and
// parallel tests) can coexist. Spec is the plain, serialisable description;
// State is what Up recorded about the running instance. It must not manage
// containers itself: that is the agents' job.
package testbed

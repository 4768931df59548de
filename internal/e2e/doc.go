// Package e2e holds end-to-end tests that drive the edgehop binary the way
// users do (testbed up, run, a client in a client namespace, rm, down) and
// check the real outcome: replies on the wire, nothing left behind.
// It has no non-test code besides helpers for those tests.
package e2e

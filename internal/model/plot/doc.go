// Package plot draws line charts as SVG, for the model's predicted-versus-
// measured figures (like Fig. 13 and Fig. 18 of the PAM paper). It is a
// small pure writer: it returns bytes, does no I/O, has no dependencies and
// knows nothing about migrations. Values are safe for concurrent use.
package plot

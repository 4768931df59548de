// Package image owns edgehop's local container images: OCI image layout
// directories in a cache (DefaultRoot/<name>), built on this machine
// (Build: the "probe" image, and Debian images made with debootstrap and
// apt from a recipe: "services" with redis, memcached and mosquitto,
// "wordpress" with WordPress on Apache and MariaDB, see wordpress.go),
// imported from a user's OCI
// layout or `docker save` tarball (Import), and unpacked into a rootfs for
// a container (Image.Unpack).
//
// No registry is reachable from edgehop's machines, so nothing here pulls
// or pushes. Images are written to a temporary directory and renamed into
// place, so a crash never leaves a half-written image, and builds of one
// name are serialised across processes by a lock file.
//
// The package must not run containers, touch network namespaces or print:
// progress goes to the injected *slog.Logger.
package image

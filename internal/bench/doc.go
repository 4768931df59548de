// Package bench runs edgehop's benchmarks against the tool a user would
// pick today, in the same run, on a testbed it brings up and always tears
// down.
//
// The continuity benchmark migrates the continuity probe back and forth
// between two nodes of a shaped testbed, once with edgehop's agents and
// once with `podman container checkpoint --export` / `podman container
// restore --import` (the tarball shipped over the same shaped link, the
// same overlay address, MAC and CRIU lock chain), and reports what a
// client saw: the longest interval without a reply, resets and lost
// bytes, beside each migration's downtime and phases. The sweep does the
// same once per state size with a redis holding that much data.
//
// The persistence benchmark (H-Container Figs. 2 and 4) moves a Redis
// holding each dataset size between the nodes live, with each strategy,
// while a client sends requests back to back on one kept connection, and
// then with Redis's own persistence: the snapshot streamed to the
// destination (redis-cli --rdb, no 5 s diskless-sync delay), a new
// redis-server started there on it. Downtime is the client's in both
// cases, and DEBUG DIGEST checks every destination's data against the
// source's.
//
// The cloudhopper benchmark (CloudHopper, seed 004, Table III) deploys
// WordPress and its MariaDB from the wordpress image as one group, loads
// it with wrk (a Lua script: new connections, unique posts, comments,
// categories, tags and users through the REST API, and reads) plus a
// probe reading every 100 ms, and migrates the group at each concurrency
// level. Failed requests are wrk's socket errors and timeouts, non-2xx
// its other replies; every write acknowledged with a 201 must be listed
// by WordPress afterwards (before wrk stops, the load reads only, so the
// last writes get their replies).
//
// The aggregation (percentiles, gap extraction from a probe timeline,
// ratios) is pure and tested on its own; everything else is I/O at the
// edge. Every number a Report holds is measured in the run that produced
// it. The package does not print: callers render a Report (WriteText or
// JSON). It must not leave anything behind on the machine except the
// podman image tags it adds to podman's host-global storage.
package bench

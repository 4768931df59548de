// Package model is edgehop's performance model of container migration: it
// predicts downtime and total migration time from the state size M, the dirty
// page rate R and the link bandwidth L, and uses the prediction to choose how
// to migrate.
//
// It carries, as pure functions of a parameter set:
//   - PAM, the Processing-Aware Migration model of Calagna et al. (COAT paper,
//     eqs. 13–37) for the traditional and the COAT procedures, with the
//     Table II–III parameters as defaults;
//   - the state-of-the-art baseline that paper compares with, whose
//     iterations are bounded by network transfer only;
//   - ARNAB's downtime model (Abdullaziz et al., eqs. 1–7);
//   - edgehop's own strategies (stop-and-copy, post-copy, live pre-copy and
//     hybrid), built from the same PAM relations;
//   - the planner that picks a strategy for downtime and duration targets,
//     and the UAV safety example (eqs. 35–37);
//   - least-squares fitting of the PAM relations (Observations 1–9) from
//     the samples every edgehop migration records.
//
// Units: times in milliseconds, sizes in bytes, bandwidth in bits per
// second, dirty rates in pages per second.
//
// The package must stay deterministic and free of I/O: it reads no files,
// starts no goroutines and never prints. The CLI (cmd/edgehop/model.go) and
// the migration code do the I/O and call it. All types are plain values and
// safe for concurrent use once built.
package model

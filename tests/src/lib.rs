//! ggml-tp-tests: the cross-backend conformance suite. Every op, over every type it supports, with
//! random shapes (odd sizes, broadcasts) and non-contiguous inputs, runs on a backend and is compared
//! with a naive float64 reference under a per-type normalized-MSE bound.
//!
//! Backend-generic: [`run_suite`] takes any `Arc<dyn Backend>` (CPU, GPU, meta). Set
//! `CONFORMANCE_SEED` to reproduce a run (the seed is printed with every failure) and
//! `CONFORMANCE_FILTER` to run only the cases whose description contains that text.
//!
//! Also a fault-injecting device ([`fault`]) for the runtime's and the server's failure tests.

pub mod case;
pub mod cases;
pub mod check;
pub mod codec;
pub mod dense;
pub mod emulated;
pub mod fault;
pub mod reference;
pub mod runner;
#[cfg(test)]
mod selftest;

use ggml_core::Backend;
use runner::Outcome;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The seed of this run: `CONFORMANCE_SEED`, or fresh from the clock.
pub fn seed() -> u64 {
    match std::env::var("CONFORMANCE_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CONFORMANCE_SEED={s} is not a u64")),
        Err(_) => cases::mix(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        ),
    }
}

/// Counts of one op on one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCount {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

/// What a suite run found on one backend.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub backend: String,
    pub seed: u64,
    pub per_op: BTreeMap<&'static str, OpCount>,
    /// One line per failed case: backend, case description, seed, message.
    pub failures: Vec<String>,
    /// One line per skipped case.
    pub skipped: Vec<String>,
    pub seconds: f64,
}

impl Report {
    pub fn ran(&self) -> usize {
        self.per_op.values().map(|c| c.passed + c.failed).sum()
    }
    pub fn passed(&self) -> usize {
        self.per_op.values().map(|c| c.passed).sum()
    }

    /// A summary: totals, then per op `passed/ran (skipped)`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "backend {}: {} cases ran, {} passed, {} failed, {} skipped in {:.1} s (CONFORMANCE_SEED={})\n",
            self.backend,
            self.ran(),
            self.passed(),
            self.failures.len(),
            self.skipped.len(),
            self.seconds,
            self.seed
        );
        for (op, c) in &self.per_op {
            s += &format!(
                "  {op:<16} {:>3}/{:<3}{}\n",
                c.passed,
                c.passed + c.failed,
                if c.skipped > 0 {
                    format!(" ({} skipped)", c.skipped)
                } else {
                    String::new()
                }
            );
        }
        s
    }

    /// Panics listing every failure, and when nothing ran.
    pub fn assert_ok(&self) {
        assert!(
            self.ran() > 0,
            "no case ran on {}:\n{}",
            self.backend,
            self.summary()
        );
        assert!(
            self.failures.is_empty(),
            "{} of {} cases failed on {}:\n{}\n{}",
            self.failures.len(),
            self.ran(),
            self.backend,
            self.failures.join("\n"),
            self.summary()
        );
    }
}

/// Runs every case (for [`seed`], filtered by `CONFORMANCE_FILTER`) on `backend`.
pub fn run_suite(backend: Arc<dyn Backend>) -> Report {
    let seed = seed();
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let cases: Vec<case::Case> = cases::all_cases(seed)
        .into_iter()
        .filter(|c| c.describe().contains(&filter))
        .collect();
    run_cases(backend, seed, &cases)
}

/// Runs `cases` (generated from `seed`) on `backend`.
pub fn run_cases(backend: Arc<dyn Backend>, seed: u64, cases: &[case::Case]) -> Report {
    let start = Instant::now();
    let mut report = Report {
        backend: backend.name(),
        seed,
        ..Default::default()
    };
    for (i, case) in cases.iter().enumerate() {
        let count = report.per_op.entry(case.op).or_default();
        match runner::run_case(&backend, case) {
            Outcome::Pass(_) => count.passed += 1,
            Outcome::Fail(msg) => {
                count.failed += 1;
                report.failures.push(format!(
                    "FAIL {} case #{i} {}: {msg} (CONFORMANCE_SEED={seed})",
                    report.backend,
                    case.describe()
                ));
            }
            Outcome::Skip(msg) => {
                count.skipped += 1;
                report.skipped.push(format!(
                    "skip {} case #{i} {}: {msg}",
                    report.backend,
                    case.describe()
                ));
            }
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report
}

/// Runs each of the first `limit` cases of `op` `runs` times on `backend`, on one allocated graph
/// with fresh inputs each time (a meta stream issues the case's program, then records it and
/// replays it where its communicator can keep the work), and checks every run; returns how many
/// cases ran (the others the device does not support).
pub fn check_repeated_runs(backend: Arc<dyn Backend>, op: &str, limit: usize, runs: u64) -> usize {
    let seed = seed();
    let cases: Vec<case::Case> = cases::all_cases(seed)
        .into_iter()
        .filter(|c| c.op == op)
        .take(limit)
        .collect();
    let mut ran = 0;
    for case in &cases {
        match runner::run_case_times(&backend, case, runs) {
            Outcome::Pass(_) => ran += 1,
            Outcome::Skip(_) => {}
            Outcome::Fail(m) => panic!(
                "{} {}: {m} (CONFORMANCE_SEED={seed})",
                backend.name(),
                case.describe()
            ),
        }
    }
    ran
}

/// Fills `data` (an F32 buffer of `count` values per device) with a pattern that differs per
/// device, sums it across the devices with `comm` and checks that every device holds the exact sum.
pub fn check_all_reduce_sum(
    comm: &dyn ggml_core::Communicator,
    data: &[ggml_core::DataRef],
    count: usize,
) {
    for (i, d) in data.iter().enumerate() {
        let v: Vec<f32> = (0..count)
            .map(|k| (k % 97) as f32 + i as f32 * 0.5)
            .collect();
        d.buffer.set(0, bytemuck::cast_slice(&v)).unwrap();
    }
    comm.all_reduce(data, ggml_core::DType::F32, count).unwrap();
    let n = data.len() as f32;
    let half_sum: f32 = (0..data.len()).map(|i| i as f32 * 0.5).sum();
    for d in data {
        let mut out = vec![0f32; count];
        d.buffer.get(0, bytemuck::cast_slice_mut(&mut out)).unwrap();
        for (k, &o) in out.iter().enumerate() {
            assert_eq!(o, (k % 97) as f32 * n + half_sum, "element {k}");
        }
    }
}

/// The devices of the registered backend family `family`, or `None` after printing
/// `skipped: no <label> device (<why>)` when it has none (no driver, as on CI).
pub fn family_devices(family: &str, label: &str) -> Option<Vec<Arc<dyn ggml_core::Device>>> {
    let reg = ggml_core::registry::backend(family)
        .unwrap_or_else(|| panic!("{family} family registered"));
    let devs = reg.devices();
    if devs.is_empty() {
        println!(
            "skipped: no {label} device ({})",
            reg.unavailable_reason().unwrap_or_default()
        );
        return None;
    }
    Some(devs)
}

/// Runs the suite on every device in `devices` of backend family `family`, printing each report;
/// prints `skipped: no <family> device` when there is none. Returns the reports.
pub fn run_family(family: &str, devices: Vec<Arc<dyn ggml_core::Device>>) -> Vec<Report> {
    let devices: Vec<_> = devices
        .into_iter()
        .filter(|d| d.family() == family)
        .collect();
    if devices.is_empty() {
        println!("skipped: no {family} device");
        return Vec::new();
    }
    devices
        .iter()
        .map(|d| {
            let backend = d
                .new_backend()
                .unwrap_or_else(|e| panic!("{}: new_backend failed: {e}", d.name()));
            let report = run_suite(backend);
            println!("{}", report.summary());
            for s in &report.skipped {
                println!("{s}");
            }
            report
        })
        .collect()
}

//! What handing one op over to the other threads of a CPU device costs: `ops` tiny ops in a row
//! (SmolLM2 decodes about 400 a token), each split into two tasks as the kernels split their rows,
//! inside one `install` of the device pool as `CpuBackend::compute` runs a node list. Timed on a pool
//! of 2 threads (hand-over between threads per op) and of 1 thread (none), alternating rounds so that
//! load from other processes hits both alike; the difference per op is the hand-over cost.
//! `cargo run --release -p backend-cpu --example handover_cost -- [ops] [rounds]`

use backend_cpu::device::build_pool;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

/// One op's share of work: a dependent chain of `n` adds (about `n` cycles).
fn work(n: u64) -> u64 {
    (0..n).fold(1u64, |a, i| black_box(a.wrapping_mul(3).wrapping_add(i)))
}

/// Microseconds for `ops` ops of two tasks of `chunk` work each on a pool of `threads`.
fn run(threads: usize, ops: usize, chunk: u64) -> f64 {
    let pool = build_pool("handover", threads).expect("thread pool");
    pool.install(|| {
        let t = Instant::now();
        for _ in 0..ops {
            let s: u64 = (0..2u64).into_par_iter().map(|i| work(chunk + i)).sum();
            black_box(s);
        }
        t.elapsed().as_secs_f64() * 1e6
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let ops = args.next().and_then(Result::ok).unwrap_or(400);
    let rounds = args.next().and_then(Result::ok).unwrap_or(21);
    for chunk in [0u64, 2_000, 20_000] {
        let (mut one, mut two) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            one.push(run(1, ops, chunk));
            two.push(run(2, ops, chunk));
        }
        let (one, two) = (median(one), median(two));
        println!(
            "work {chunk:>6} adds per task: 1 thread {:.2} us/op, 2 threads {:.2} us/op, hand-over cost {:.2} us/op (2 threads save {:.2} us/op of compute)",
            one / ops as f64,
            two / ops as f64,
            (two - one / 2.0) / ops as f64,
            (one - two) / ops as f64
        );
    }
}

//! Aggregate decode throughput of continuous batching: `n` sequences (1, 4, 8) decode `n_gen` tokens
//! each after a 32-token prompt, with every sequence in one forward pass per step (batched, as
//! `ggml-tp serve` runs its slots) and, in the same run, with one pass per sequence per step
//! (interleaved, as it did before batching). Prints tokens/s summed over the sequences and the
//! batched / interleaved ratio.
//! `cargo run --release -p llama --example batch_throughput -- MODEL [n_gen] [none|tensor2|layer2] [threads]`

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use ggml_core::Device;
use llama::{BatchSession, Model, Outputs, Placement, SeqTokens, SessionOptions};
use std::sync::Arc;
use std::time::Instant;

const PROMPT: usize = 32;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("model path");
    let n_gen: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(32);
    let split = args.next().unwrap_or_else(|| "none".into());
    let threads: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(2);
    let placement = match split.as_str() {
        "none" => Placement::Single(cpu_devices(1, threads).unwrap().remove(0)),
        "tensor2" | "layer2" => {
            let two: Vec<Arc<dyn Device>> = cpu_devices(2, threads)
                .unwrap()
                .into_iter()
                .map(|d| d as Arc<dyn Device>)
                .collect();
            if split == "tensor2" {
                Placement::Tensor(MetaDevice::new(two, None).unwrap())
            } else {
                Placement::Layers {
                    devices: two,
                    ratios: vec![1.0, 1.0],
                }
            }
        }
        other => panic!("split {other:?}: none, tensor2 or layer2"),
    };
    let model = Arc::new(Model::load(&path, &placement).unwrap());
    let n_vocab = model.config.n_vocab as u32;
    let opts = SessionOptions {
        n_ctx: PROMPT + n_gen + 1,
        ..SessionOptions::default()
    };
    println!("{path} split {split}, {n_gen} tokens per sequence");
    println!("| seqs | batched t/s | interleaved t/s | ratio |");
    println!("|---:|---:|---:|---:|");
    for n in [1usize, 4, 8] {
        let mut s = BatchSession::new(model.clone(), opts, n).unwrap();
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|k| {
                (0..PROMPT as u32)
                    .map(|i| (7 + 31 * k as u32 + i) % n_vocab)
                    .collect()
            })
            .collect();
        let batched = decode(&mut s, &prompts, n_gen, true);
        let interleaved = decode(&mut s, &prompts, n_gen, false);
        println!(
            "| {n} | {batched:.1} | {interleaved:.1} | {:.2} |",
            batched / interleaved
        );
    }
}

/// Reads the prompts, then times `n_gen` greedy decode steps of every sequence (all in one pass per
/// step, or one pass per sequence); returns the tokens per second over all sequences.
fn decode(s: &mut BatchSession, prompts: &[Vec<u32>], n_gen: usize, together: bool) -> f64 {
    let parts: Vec<SeqTokens> = prompts
        .iter()
        .enumerate()
        .map(|(seq, p)| SeqTokens {
            seq,
            tokens: p,
            outputs: Outputs::Last,
        })
        .collect();
    for seq in 0..prompts.len() {
        s.truncate(seq, 0).unwrap();
    }
    let mut next: Vec<u32> = s
        .eval(&parts)
        .unwrap()
        .iter()
        .map(|l| argmax(l.last()))
        .collect();
    let t = Instant::now();
    for _ in 0..n_gen {
        let tokens: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
        let parts: Vec<SeqTokens> = tokens
            .iter()
            .enumerate()
            .map(|(seq, tok)| SeqTokens {
                seq,
                tokens: tok,
                outputs: Outputs::Last,
            })
            .collect();
        let logits = if together {
            s.eval(&parts).unwrap()
        } else {
            parts
                .chunks(1)
                .flat_map(|one| s.eval(one).unwrap())
                .collect()
        };
        next = logits.iter().map(|l| argmax(l.last())).collect();
    }
    (prompts.len() * n_gen) as f64 / t.elapsed().as_secs_f64()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

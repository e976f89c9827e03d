//! The per-token cost of constrained decoding on a real vocabulary: random walks through a JSON
//! schema's grammar, timing each token's mask computation (llguidance, on a rayon thread while
//! the forward pass would run) and the masked sample against an unmasked one (on the critical
//! path). Run: `cargo run --release -p llama --example mask_cost -- [MODEL.gguf] [TOKENS]`
//! (default: SmolLM2-135M from the model cache, 2000 tokens).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ggml_core::gguf::GgufFile;
use llama::constraint::{ConstraintEngine, Grammar};
use llama::sampling::{Sampler, SamplingParams};
use llama::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::json;

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Mean, median and 99th percentile in microseconds.
fn summary(times: &mut [Duration]) -> String {
    times.sort_unstable();
    let mean = times.iter().map(|&d| micros(d)).sum::<f64>() / times.len() as f64;
    let at = |q: f64| micros(times[((times.len() - 1) as f64 * q) as usize]);
    format!(
        "mean {mean:.1} µs, p50 {:.1} µs, p99 {:.1} µs",
        at(0.5),
        at(0.99)
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = match args.next() {
        Some(p) => p.into(),
        None => ggml_core::env::models_cache_dir()
            .ok_or("no model cache folder (set XDG_CACHE_HOME or HOME)")?
            .join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    let want: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(2000);
    let tokenizer = Arc::new(Tokenizer::from_gguf(&GgufFile::open(&path)?)?);
    let n_vocab = tokenizer.n_vocab();
    let t0 = Instant::now();
    let engine = ConstraintEngine::new(tokenizer.clone())?;
    println!(
        "vocabulary {n_vocab} tokens, engine built in {:.1} ms",
        micros(t0.elapsed()) / 1e3
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "maxLength": 40},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
            "address": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": false},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "email", "tags", "address", "active"],
        "additionalProperties": false,
    });
    let grammar = Grammar::JsonSchema(schema);
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let logits: Vec<f32> = (0..n_vocab).map(|_| rng.gen_range(-8.0..8.0)).collect();
    let mut sampler = Sampler::new(SamplingParams::default())?;
    let (mut compile, mut masks, mut plain, mut masked) = (vec![], vec![], vec![], vec![]);
    let mut walks = 0;
    while masks.len() < want {
        walks += 1;
        let t = Instant::now();
        let mut c = engine.compile(&grammar)?;
        compile.push(t.elapsed());
        for _ in 0..1000 {
            let t = Instant::now();
            sampler.sample(&logits, &[])?;
            plain.push(t.elapsed());
            let t = Instant::now();
            sampler.sample_allowed(&logits, &[], &|id| c.allows(id))?;
            masked.push(t.elapsed());
            let allowed: Vec<u32> = (0..n_vocab as u32)
                .filter(|&id| c.allows(id) && !tokenizer.is_eog(id))
                .collect();
            if allowed.is_empty() {
                break;
            }
            let tok = allowed[rng.gen_range(0..allowed.len())];
            let t = Instant::now();
            let complete = c.advance(tok)?;
            c.ready()?;
            masks.push(t.elapsed());
            if complete {
                break;
            }
        }
    }
    println!("{walks} walks, {} tokens", masks.len());
    println!("compile + first mask: {}", summary(&mut compile));
    println!(
        "next mask per token (advance + compute): {}",
        summary(&mut masks)
    );
    println!("sample, unmasked: {}", summary(&mut plain));
    println!("sample, masked: {}", summary(&mut masked));
    Ok(())
}

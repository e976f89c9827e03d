//! Flash attention on the kernels' device (part of `kernel_cases`): the decode kernels (few
//! queries), the tensor-core prompt kernels and the BLAS path (queries >= 16) against the float64
//! reference.

use super::*;

/// One flash_attn_ext case: head sizes, heads, queries, keys, sequences, K/V and mask types and the
/// op's options; `kv_view` lays K and V out as the KV cache does (heads inside key rows).
#[derive(Clone, Copy)]
struct AttnCase {
    d: usize,
    dv: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    seqs: usize,
    kv: DType,
    mask: DType,
    sinks: bool,
    softcap: f32,
    max_bias: f32,
    kv_view: bool,
}

impl AttnCase {
    fn new(kv: DType, heads: usize, kv_heads: usize, queries: usize, keys: usize) -> AttnCase {
        AttnCase {
            d: 128,
            dv: 128,
            heads,
            kv_heads,
            queries,
            keys,
            seqs: 1,
            kv,
            mask: DType::F16,
            sinks: false,
            softcap: 0.0,
            max_bias: 0.0,
            kv_view: false,
        }
    }

    fn params(&self) -> AttnParams {
        AttnParams {
            scale: 1.0 / (self.d as f32).sqrt(),
            max_bias: self.max_bias,
            softcap: self.softcap,
        }
    }

    fn name(&self) -> String {
        let c = self;
        format!(
            "D {}/{} heads {}/{} {} queries {} keys {} seqs, {:?} mask, sinks {} softcap {} alibi {} cache view {}",
            c.d, c.dv, c.heads, c.kv_heads, c.queries, c.keys, c.seqs, c.mask, c.sinks, c.softcap,
            c.max_bias, c.kv_view
        )
    }

    /// Q (a permuted view, as the models make it), K, V, and the sinks when used.
    fn inputs(&self) -> (Vec<InputSpec>, Option<InputSpec>) {
        let c = self;
        let permuted = ViewKind::Permute([0, 2, 1, 3]);
        let kv_layout = if c.kv_view {
            permuted
        } else {
            ViewKind::Contig
        };
        let qkv = vec![
            InputSpec::new(DType::F32, [c.d, c.queries, c.heads, c.seqs]).view(permuted),
            InputSpec::new(c.kv, [c.d, c.keys, c.kv_heads, c.seqs]).view(kv_layout),
            InputSpec::new(c.kv, [c.dv, c.keys, c.kv_heads, c.seqs]).view(kv_layout),
        ];
        let sinks = c
            .sinks
            .then(|| InputSpec::new(DType::F32, [c.heads, 1, 1, 1]).gen(Gen::Normal(2.0)));
        (qkv, sinks)
    }
}

/// Pushes `c` with a random mask (rows padded past the queries, as ggml pads them, and shared by
/// the sequences).
fn push_attn(set: &mut CaseSet, c: AttnCase) {
    push_attn_masked(set, c, Gen::Mask);
}

/// Pushes `c` with a mask drawn from `mask` (a [`Gen::Mask`] or [`Gen::PrefixMask`]).
fn push_attn_masked(set: &mut CaseSet, c: AttnCase, mask: Gen) {
    let (mut inputs, sinks) = c.inputs();
    inputs.push(InputSpec::new(c.mask, [c.keys, c.queries + 3, 1, 1]).gen(mask));
    inputs.extend(sinks);
    let name = match mask {
        Gen::PrefixMask(n) => format!("{} keys_used={n}", c.name()),
        Gen::CausalMask { past, plain } => {
            let values = if plain { "0 or -inf" } else { "random" };
            format!("{} causal after {past}, {values}", c.name())
        }
        _ => c.name(),
    };
    push_flash_attn(set, name, inputs, c.kv, c.params());
}

/// Prompts of every K/V type and head size: F16 and Q8_0 K/V with heads of 64 or 128 take the
/// tensor-core kernels on a device with them (the emulated CUDA device too), the rest the BLAS path.
#[test]
fn flash_attn_prefill_every_type() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // Llama-like prefill with the KV cache's layout, every K/V type.
    for kv in [DType::F16, DType::F32, DType::BF16, DType::Q8_0] {
        push_attn(
            &mut set,
            AttnCase {
                kv_view: true,
                ..AttnCase::new(kv, 8, 2, 512, 300)
            },
        );
    }
    // Key counts 1, 7, 4100 with GQA 8; GQA 1; several sequences with sinks.
    for keys in [1, 7, 4100] {
        push_attn(&mut set, AttnCase::new(DType::F16, 8, 1, 64, keys));
    }
    push_attn(&mut set, AttnCase::new(DType::F16, 4, 4, 33, 300));
    push_attn(
        &mut set,
        AttnCase {
            seqs: 2,
            sinks: true,
            ..AttnCase::new(DType::F16, 4, 2, 40, 77)
        },
    );
    // Head sizes 64, 192 -> 128 (D_v != D_k), 512; softcap; ALiBi.
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            softcap: 20.0,
            ..AttnCase::new(DType::F16, 4, 1, 20, 77)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 192,
            dv: 128,
            max_bias: 8.0,
            ..AttnCase::new(DType::F16, 4, 2, 24, 100)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 512,
            dv: 512,
            ..AttnCase::new(DType::F32, 2, 1, 17, 50)
        },
    );
    run(set, seed);
}

/// The tensor-core prompt kernels (`k_flash_attn_mma_*`: heads of 64 and 128, F16 or Q8_0 K/V) on
/// the emulated CUDA device: causal prompts after cached keys (tiles hidden from a whole block are
/// skipped, others from some warps only), query and key counts off the 64-row blocks and 64-key
/// tiles, GQA, sinks, softcap, ALiBi, several sequences, the KV cache's layout; each way the kernel
/// reads its mask (F32 or F16 rows read a key pair at a time, both only where an even key count
/// aligns the rows; other rows element by element).
#[test]
fn flash_attn_prefill_tensor_cores() {
    // What a child process with GGML_TP_ATTN_MMA_WARPS set checks it ran with (kernels_on_host).
    println!(
        "prompt attention in blocks of {} warps",
        ggml_gpu::settings::settings().attn_mma_warps
    );
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for (kv, mask, plain, d, heads, kv_heads, queries, past) in [
        (DType::F16, DType::F16, false, 128, 8, 2, 200, 130),
        (DType::F16, DType::F32, true, 128, 8, 2, 200, 130),
        (DType::F16, DType::F32, false, 128, 4, 1, 77, 0),
        (DType::Q8_0, DType::F16, true, 128, 4, 1, 77, 0),
        (DType::F16, DType::F16, true, 64, 6, 3, 130, 6),
        (DType::F16, DType::F32, false, 64, 2, 1, 66, 64),
        (DType::Q8_0, DType::F16, false, 64, 2, 2, 16, 300),
    ] {
        push_attn_masked(
            &mut set,
            AttnCase {
                d,
                dv: d,
                kv_view: true,
                mask,
                ..AttnCase::new(kv, heads, kv_heads, queries, past + queries)
            },
            Gen::CausalMask { past, plain },
        );
    }
    push_attn(
        &mut set,
        AttnCase {
            mask: DType::F32,
            ..AttnCase::new(DType::F16, 4, 2, 48, 96)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            seqs: 2,
            sinks: true,
            softcap: 30.0,
            ..AttnCase::new(DType::F16, 4, 2, 40, 77)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            max_bias: 8.0,
            ..AttnCase::new(DType::F16, 4, 1, 65, 129)
        },
    );
    run(set, seed);
}

#[test]
fn flash_attn_few_queries() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // One query (decode) over 1, 7, 300, 4100 keys, GQA 1/4/8, every K/V type for the split path.
    for (heads, kv_heads) in [(4, 4), (8, 2), (16, 2)] {
        for keys in [1, 7, 300, 4100] {
            push_attn(
                &mut set,
                AttnCase {
                    kv_view: true,
                    ..AttnCase::new(DType::F16, heads, kv_heads, 1, keys)
                },
            );
        }
    }
    for kv in [DType::F32, DType::BF16, DType::Q8_0] {
        push_attn(
            &mut set,
            AttnCase {
                sinks: true,
                ..AttnCase::new(kv, 8, 2, 1, 4100)
            },
        );
    }
    // Five queries (under the BLAS threshold): GQA 8 (two blocks per group), GQA 6 (4 + 2 heads).
    push_attn(
        &mut set,
        AttnCase {
            sinks: true,
            ..AttnCase::new(DType::F16, 8, 1, 5, 700)
        },
    );
    push_attn(&mut set, AttnCase::new(DType::F16, 6, 1, 5, 33));
    // Wide heads (d256 and d512 kernels), D_v != D_k, softcap, ALiBi, several sequences.
    push_attn(
        &mut set,
        AttnCase {
            d: 256,
            dv: 256,
            softcap: 30.0,
            ..AttnCase::new(DType::F16, 4, 2, 1, 1000)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 192,
            dv: 128,
            max_bias: 8.0,
            ..AttnCase::new(DType::Q8_0, 4, 1, 2, 300)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 512,
            dv: 512,
            seqs: 2,
            ..AttnCase::new(DType::F16, 2, 1, 3, 500)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            ..AttnCase::new(DType::F32, 4, 1, 1, 5000)
        },
    );
    run(set, seed);
}

#[test]
fn flash_attn_vec_splits_and_head_blocks() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // One query over key counts around the tile (64) and split sizes, GQA 1/4/8: one head per
    // block, one tile per split (the last one partial or a single key).
    for (heads, kv_heads) in [(4, 4), (8, 2), (16, 2)] {
        for keys in [1, 7, 255, 256, 257] {
            push_attn(
                &mut set,
                AttnCase {
                    kv_view: true,
                    ..AttnCase::new(DType::F16, heads, kv_heads, 1, keys)
                },
            );
        }
    }
    // Long KV: the heads of a group share a block (GQA 4 and 8, and 6 = 4 + 2 over 5 queries),
    // several tiles per split; sinks, softcap and ALiBi on shared blocks.
    push_attn(
        &mut set,
        AttnCase {
            kv_view: true,
            sinks: true,
            ..AttnCase::new(DType::F16, 8, 2, 1, 8192)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            softcap: 30.0,
            ..AttnCase::new(DType::BF16, 16, 2, 1, 4100)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            max_bias: 8.0,
            sinks: true,
            ..AttnCase::new(DType::F16, 6, 1, 5, 4100)
        },
    );
    // A KV cache's padding: the keys past the used ones masked, so that whole tiles (one head per
    // block, 40 of 256 keys) and whole splits (shared blocks, 1000 of 4352 keys) see no unmasked key.
    for (kv, heads, keys, used) in [
        (DType::F16, 32, 256, 40),
        (DType::F16, 32, 4352, 1000),
        (DType::BF16, 8, 4352, 70),
    ] {
        push_attn_masked(
            &mut set,
            AttnCase {
                kv_view: true,
                sinks: used == 70,
                ..AttnCase::new(kv, heads, 8, 1, keys)
            },
            Gen::PrefixMask(used),
        );
    }
    // Head sizes 64, 256 and 512 (F16: one, two and four passes of 256 bytes), D_v != D_k, F32
    // rows (two passes at D 128), several sequences.
    for (d, keys) in [(64, 257), (256, 4100), (512, 257)] {
        push_attn(
            &mut set,
            AttnCase {
                d,
                dv: d,
                kv_view: true,
                ..AttnCase::new(DType::F16, 8, 2, 1, keys)
            },
        );
    }
    push_attn(
        &mut set,
        AttnCase {
            d: 192,
            dv: 128,
            seqs: 2,
            ..AttnCase::new(DType::F32, 4, 1, 2, 300)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 256,
            dv: 64,
            ..AttnCase::new(DType::BF16, 4, 4, 3, 70)
        },
    );
    run(set, seed);
}

#[test]
fn flash_attn_vec_head_sizes_groups_and_splits() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // Decode attention's head sizes: rows of 64, 128 and 256 F16 or BF16 elements, groups of
    // 1, 2, 3 (a 4-head body with a head unused), 4 and 8 (two blocks per group), several queries
    // and sequences, splits of the keys (merged by the combine) and single-split blocks.
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            seqs: 2,
            sinks: true,
            ..AttnCase::new(DType::F16, 12, 4, 2, 3000)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 256,
            dv: 256,
            softcap: 30.0,
            ..AttnCase::new(DType::BF16, 8, 8, 1, 2100)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            max_bias: 8.0,
            kv_view: true,
            ..AttnCase::new(DType::BF16, 64, 8, 1, 700)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            ..AttnCase::new(DType::F16, 2, 1, 4, 33)
        },
    );
    // A long cache mostly padding: whole splits see no unmasked key; a short one of 8 keys in a
    // 256-key view (one batch of one group).
    for (keys, used) in [(8192, 5000), (256, 8)] {
        push_attn_masked(
            &mut set,
            AttnCase {
                kv_view: true,
                sinks: used == 8,
                ..AttnCase::new(DType::F16, 32, 8, 1, keys)
            },
            Gen::PrefixMask(used),
        );
    }
    run(set, seed);
}

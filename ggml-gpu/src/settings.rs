//! ggml-gpu's settings, read once from the environment through [`ggml_core::env`]; each switch turns
//! one dispatch path off (or moves a tuning point) for A/B measurements:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_ATTN_VEC` | decode attention may take `k_flash_attn_vec` (default on; off keeps `k_flash_attn`) |
//! | `GGML_TP_ATTN_MMA` | prompt attention may take `k_flash_attn_mma_*` on tensor cores (default on; off keeps the BLAS path) |
//! | `GGML_TP_MOE_MMA` | grouped expert products of prompts may take `k_moe_mma_*` on tensor cores (default on; off keeps `k_moe_mm_*`) |
//! | `GGML_TP_ATTN_MMA_WARPS` | warps per `k_flash_attn_mma_*` block, 4 or 8 (16 query rows each; default 8) |
//! | `GGML_TP_ATTN_VEC_BLOCKS` | blocks a decode attention launch aims for, splitting the keys to reach them (default 256) |
//! | `GGML_TP_GROUP_PRODUCTS` | adjacent single-column products of one activation run as one grouped GEMV (default on) |
//! | `GGML_TP_GEMV_ROW_PAIRS` | single-column GEMV launches of quantized weights take the two-column kernel, whose row groups hold two rows sharing each activation load (default on) |
//! | `GGML_TP_GROUPED_WEIGHTS` | the weight types kept regrouped where rows are whole groups of 32 blocks (`DType::Q4_0G` / `DType::Q8_0G`: 16-byte loads of consecutive blocks): `q8_0` (default), `q4_0,q8_0`, or `none` |
//! | `GGML_TP_FUSE_CHAINS` | chains of element-wise nodes in one launch, a norm chain's trailing scale, the delta-net rule with the copy of its state (default on) |
//! | `GGML_TP_FUSE_DECODE` | the decode step's fusions: gate/up GEMV with its GLU (also of the chosen experts), rope of k with its cache write, a MoE router, a MoE expert mix (default on) |

use ggml_core::DType;
use std::sync::OnceLock;

/// The switches of the dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_ATTN_VEC`: decode attention may take `k_flash_attn_vec`.
    pub attn_vec: bool,
    /// `GGML_TP_ATTN_MMA`: prompt attention may take `k_flash_attn_mma_*`.
    pub attn_mma: bool,
    /// `GGML_TP_MOE_MMA`: grouped expert products may take `k_moe_mma_*`.
    pub moe_mma: bool,
    /// `GGML_TP_ATTN_MMA_WARPS`: warps per `k_flash_attn_mma_*` block (4 or 8).
    pub attn_mma_warps: usize,
    /// `GGML_TP_ATTN_VEC_BLOCKS`: the blocks decode attention aims for (none: the dispatch's default).
    pub attn_vec_blocks: Option<usize>,
    /// `GGML_TP_GROUP_PRODUCTS`: products of one activation are grouped into one GEMV launch.
    pub group_products: bool,
    /// `GGML_TP_GEMV_ROW_PAIRS`: single-column GEMV row groups of quantized weights take two rows.
    pub gemv_row_pairs: bool,
    /// `GGML_TP_FUSE_DECODE`: the decode fusions are on.
    pub fuse_decode: bool,
    /// `GGML_TP_FUSE_CHAINS`: element-wise chains, norm chains' scales and the delta-net state
    /// copy are fused.
    pub fuse_chains: bool,
    /// `GGML_TP_GROUPED_WEIGHTS`: the weight types kept in their regrouped layouts.
    pub grouped_weights: Vec<DType>,
}

impl Default for Settings {
    /// Every path on (only the regrouped layouts that measured faster).
    fn default() -> Self {
        Settings {
            attn_vec: true,
            attn_mma: true,
            moe_mma: true,
            attn_mma_warps: 8,
            attn_vec_blocks: None,
            group_products: true,
            gemv_row_pairs: true,
            fuse_decode: true,
            fuse_chains: true,
            // Measured on an H100 (Llama-3.1-8B shapes, tg128): Q8_0 228.0 -> 240.9 t/s
            // regrouped, Q4_0 326.3 -> 317.2 (slower, so not by default).
            grouped_weights: vec![DType::Q8_0],
        }
    }
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        let d = Settings::default();
        Settings {
            attn_vec: ggml_core::env::flag("GGML_TP_ATTN_VEC", d.attn_vec),
            attn_mma: ggml_core::env::flag("GGML_TP_ATTN_MMA", d.attn_mma),
            moe_mma: ggml_core::env::flag("GGML_TP_MOE_MMA", d.moe_mma),
            attn_mma_warps: ggml_core::env::count("GGML_TP_ATTN_MMA_WARPS")
                .filter(|w| matches!(w, 4 | 8))
                .unwrap_or(d.attn_mma_warps),
            attn_vec_blocks: ggml_core::env::count("GGML_TP_ATTN_VEC_BLOCKS"),
            group_products: ggml_core::env::flag("GGML_TP_GROUP_PRODUCTS", d.group_products),
            gemv_row_pairs: ggml_core::env::flag("GGML_TP_GEMV_ROW_PAIRS", d.gemv_row_pairs),
            fuse_decode: ggml_core::env::flag("GGML_TP_FUSE_DECODE", d.fuse_decode),
            fuse_chains: ggml_core::env::flag("GGML_TP_FUSE_CHAINS", d.fuse_chains),
            grouped_weights: ggml_core::env::dtypes("GGML_TP_GROUPED_WEIGHTS")
                .unwrap_or(d.grouped_weights),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}

//! What the architectures share: the hyper-parameters ([`config`]), the weight blocks and their splits
//! ([`blocks`]), the recurrent mixer of the hybrid models ([`delta_net`], cut by
//! [`delta_net_splits`]), the one forward graph
//! builder ([`forward`]), the hooks through which an architecture adds its own parts to it
//! ([`hooks`]), and the model-wide weights around the layers ([`ModelWeights`]).

pub mod blocks;
pub mod config;
pub mod delta_net;
pub mod delta_net_splits;
pub mod forward;
pub mod hooks;

use crate::error::ModelError;
use crate::load::{Home, Loader, Weight};
use backend_meta::WeightSplit;
use blocks::Layer;
use config::ModelConfig;
use hooks::Extension;

/// The token embeddings, output norm and head of a model.
pub struct Head {
    pub tok_embd: Weight,
    pub output_norm: Weight,
    /// The head (the embedding table when tied).
    pub output: Weight,
}

impl Head {
    /// Loads the embeddings (with the first device of a layer split) and the output norm and head
    /// (with the last).
    pub fn load(ld: &Loader, cfg: &ModelConfig) -> Result<Head, ModelError> {
        let (d, v) = (cfg.n_embd, cfg.n_vocab);
        let m = || WeightSplit::Mirrored;
        // Every device keeps the whole table: a lookup in a table split by columns would leave each
        // device a slice of the rows, whose gather goes through host memory and holds every device
        // at the start of each pass (16 ms of a 512-token prompt of Llama-3.1-8B over two logical
        // H200s, BENCHMARKS.md). The copies cost (N - 1) / N of the table more memory.
        let tok_embd = ld.get("token_embd.weight", &[d, v], m(), Home::First)?;
        let output_norm = ld.get("output_norm.weight", &[d], m(), Home::Last)?;
        let output = match ld.opt(
            "output.weight",
            &[d, v],
            WeightSplit::axis(1, v, 1),
            Home::Last,
        )? {
            Some(w) => w,
            // Tied head on the last device: its own copy of the table.
            None if ld.alloc.placement.splits_layers() => {
                ld.get("token_embd.weight", &[d, v], m(), Home::Last)?
            }
            // Tied head in tensor mode: its own copy of the table split by vocabulary rows, so
            // that each device computes its share of the logits (with the mirrored lookup table
            // every device computed all of them: Qwen2.5-0.5B decode over two CPU devices
            // 0.85-0.92x of one). The copies cost 1 / N of the table more per device.
            None if ld.alloc.placement.splits_tensors() => ld.get(
                "token_embd.weight",
                &[d, v],
                WeightSplit::axis(1, v, 1),
                Home::Last,
            )?,
            None => tok_embd.clone(),
        };
        Ok(Head {
            tok_embd,
            output_norm,
            output,
        })
    }
}

/// A model's weights as the forward graph reads them.
pub struct ModelWeights {
    pub head: Head,
    pub layers: Vec<Layer>,
    /// The architecture's model-wide parts beyond the embeddings, layers and head (Gemma 4's per-layer
    /// token embeddings).
    pub extension: Option<Box<dyn Extension>>,
}

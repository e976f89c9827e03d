//! The layer below the architectures, knowing none of them: where each tensor goes ([`Placement`],
//! [`Home`], [`Alloc`]), reading named tensors from the memory-mapped GGUF file onto devices
//! ([`Loader`], [`Weight`]) and typed access to the file's metadata ([`Meta`]), every count of it
//! bounded ([`limits`]). Each architecture (`crate::arch`) names its tensors and declares their
//! splits through it.

pub mod limits;
mod meta;
mod placement;
mod weights;

pub use meta::Meta;
pub use placement::Placement;
pub use weights::{Alloc, Home, Loader, Weight};

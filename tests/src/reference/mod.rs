//! The naive float64 reference: every op of the graph over [`crate::dense::Dense`] values, following
//! ggml's semantics (ne[0] innermost, broadcast by repetition).

pub mod attention;
pub mod delta_net;
pub mod elementwise;
pub mod matrix;

//! Quantization and dequantization of the GGUF block formats.

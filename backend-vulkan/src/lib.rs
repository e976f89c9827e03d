//! backend-vulkan: the Vulkan backend of ggml-tp. Compute shaders written in GLSL (compiled to SPIR-V
//! at build time by glslang, in a 16-bit-storage/subgroup variant and a base variant) run through
//! `ash`, which loads libvulkan at run time. Every physical device becomes one or several logical
//! devices `vulkan:N` (`GGML_TP_VULKAN_DEVICES=N` opens each N times, for tensor-parallel tests on one
//! GPU); tensors live in device-local buffers, host transfers go through a staging buffer.

pub mod context;
pub mod device;
pub mod instance;
pub mod memory;
pub mod ops;
pub mod pipeline;
pub mod reg;
pub mod settings;
pub mod stream;

pub use device::VulkanDevice;
pub use instance::{open_devices, open_devices_with, Variant};
pub use memory::{VulkanBuffer, VulkanBufferType};
pub use reg::VulkanReg;
pub use stream::VulkanBackend;

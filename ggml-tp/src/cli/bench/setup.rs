//! What `bench` records of a setup besides its speed, in llama-bench's terms: the build (commit and
//! number, from the build script), the CPU and GPUs, the backends, the model's type and parameter
//! count, the placement and the cache types.

use super::super::load::{Loaded, ModelArgs, ModelSource};
use super::report::SetupFields;
use ggml_core::backend::{Device, DeviceKind};
use ggml_core::gguf::GgufFile;
use llama::model::Placement;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The devices a placement uses.
pub fn placement_devices(p: &Placement) -> Vec<Arc<dyn Device>> {
    match p {
        Placement::Single(d) => vec![d.clone()],
        Placement::Layers { devices, .. } => devices.clone(),
        Placement::Tensor(m) => m.devices().to_vec(),
    }
}

/// The CPU's model name from `/proc/cpuinfo` (empty where there is none).
fn cpu_info() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "model name").then(|| value.trim().to_string())
        })
        .unwrap_or_default()
}

/// A backend family as llama-bench names it (`CPU`, `CUDA`, `ROCm`, `Vulkan`).
fn backend_name(family: &str) -> String {
    match family {
        "cpu" => "CPU".into(),
        "cuda" => "CUDA".into(),
        "hip" => "ROCm".into(),
        "vulkan" => "Vulkan".into(),
        other => other.to_uppercase(),
    }
}

/// The values of `items` once each, in first-seen order, joined by `sep`.
fn distinct(items: impl Iterator<Item = String>, sep: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen.join(sep)
}

/// `arch parameters type`, e.g. `llama 135M Q4_1`: the type is the one most weight bytes have.
pub fn model_type(arch: &str, file: &GgufFile) -> (String, u64) {
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let mut bytes_per_type: BTreeMap<&str, usize> = BTreeMap::new();
    for t in file.tensors() {
        *bytes_per_type.entry(t.dtype.name()).or_default() += t.size_bytes;
    }
    let main_type = bytes_per_type
        .iter()
        .max_by_key(|(_, &bytes)| bytes)
        .map_or_else(String::new, |(name, _)| name.to_uppercase());
    let size = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{:.0}M", n_params as f64 / 1e6)
    };
    (format!("{arch} {size} {main_type}"), n_params)
}

/// Shares as llama-bench writes `tensor_split`: `/`-separated with two decimals, `0.00` when equal.
fn tensor_split(shares: &[f32]) -> String {
    if shares.is_empty() {
        return "0.00".into();
    }
    let parts: Vec<String> = shares.iter().map(|s| format!("{s:.2}")).collect();
    parts.join("/")
}

/// Everything a record says of the loaded setup `l`.
pub fn setup_fields(l: &Loaded, args: &ModelArgs) -> SetupFields {
    let devices = placement_devices(l.model.placement());
    let gpu_info = distinct(
        devices
            .iter()
            .filter(|d| d.kind() == DeviceKind::Gpu)
            .map(|d| d.description()),
        ", ",
    );
    let (model_type, model_n_params) = model_type(l.model.config.arch.name(), &l.file);
    let model_filename = match &l.source {
        ModelSource::File(path) => path.display().to_string(),
        ModelSource::Synthetic(_) => l.source.name(),
    };
    let cache = args.cache_type.dtype().name().to_string();
    SetupFields {
        build_commit: env!("GGML_TP_BUILD_COMMIT").into(),
        build_number: env!("GGML_TP_BUILD_NUMBER").parse().unwrap_or(0),
        cpu_info: cpu_info(),
        gpu_info,
        backends: distinct(devices.iter().map(|d| backend_name(d.family())), ","),
        model_filename,
        model_type,
        model_size: l.file_size,
        model_n_params,
        n_threads: args.threads(),
        type_k: cache.clone(),
        type_v: cache,
        split_mode: l.split_mode.name().to_string(),
        devices: l.device_names.join("/"),
        tensor_split: tensor_split(&args.tensor_split),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::gguf::GgufWriter;
    use ggml_core::DType;

    #[test]
    fn model_type_counts_parameters_and_names_the_main_weight_type() {
        let mut w = GgufWriter::new();
        w.add_tensor("big", DType::Q8_0, &[64, 8], vec![0u8; 16 * 34])
            .unwrap();
        w.add_tensor("norm", DType::F32, &[64], vec![0u8; 256])
            .unwrap();
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let (name, n) = model_type("llama", &file);
        assert_eq!(n, 64 * 8 + 64);
        assert_eq!(name, "llama 0M Q8_0");
    }

    #[test]
    fn shares_and_names_read_like_llama_bench() {
        assert_eq!(tensor_split(&[]), "0.00");
        assert_eq!(tensor_split(&[3.0, 1.0]), "3.00/1.00");
        assert_eq!(backend_name("hip"), "ROCm");
        assert_eq!(
            distinct(["a", "b", "a"].into_iter().map(String::from), ","),
            "a,b"
        );
    }
}

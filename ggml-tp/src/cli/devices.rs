//! `ggml-tp devices`: every registered backend family with its devices (name, description, memory;
//! a logical CUDA device says which GPU and share it is, and its memory is that share), or the
//! reason a family has none, and plugins that failed to load.

use super::CliResult;
use ggml_core::registry;

/// Options of `devices` (none).
#[derive(clap::Args, Debug)]
pub struct Args {}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

pub fn run(_args: &Args) -> CliResult {
    let families = registry::backends();
    if families.is_empty() {
        println!("no backend family is registered");
    }
    for reg in families {
        let devices = reg.devices();
        println!("{}: {} device(s)", reg.name(), devices.len());
        if devices.is_empty() {
            let reason = reg
                .unavailable_reason()
                .unwrap_or_else(|| "no devices found".into());
            println!("  unavailable: {reason}");
        }
        for d in devices {
            let m = d.memory();
            println!(
                "  {:<8} {}  (memory: {:.1} GiB free of {:.1} GiB)",
                d.name(),
                d.description(),
                gib(m.free),
                gib(m.total)
            );
        }
    }
    for e in registry::plugin_errors() {
        println!("plugin not loaded: {e}");
    }
    println!(
        "(virtual CPU devices for a run: --cpu-devices N or --devices cpu:0,cpu:1; \
         GGML_TP_CPU_DEVICES sets how many are listed here; GGML_TP_CUDA_LOGICAL=N presents \
         every GPU as N logical CUDA devices)"
    );
    Ok(())
}

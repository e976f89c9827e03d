//! Records the compiler version, which is part of the plugin ABI check (Rust trait objects cross the
//! plugin boundary, so host and plugin must come from the same compiler and core version).

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_else(|| "unknown rustc".into());
    println!("cargo:rustc-env=GGML_TP_RUSTC_VERSION={}", version.trim());
    println!("cargo:rerun-if-changed=build.rs");
}

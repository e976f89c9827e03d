//! `ptxas`: each CUDA kernel's registers, stack frame and spills without a GPU. NVRTC and ptxas
//! come from NVIDIA's CUDA wheels on the Python package index (pinned, kept in the user's cache);
//! `backend-cuda`'s `ptx` example compiles the kernel program (or `GGML_TP_CUDA_PROGRAM`'s file)
//! to PTX, and `ptxas -v` assembles it for one architecture. The counts are those of this CUDA
//! release, which may differ a little from the GPU machine's NVRTC.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use model_cache::fetch::{ensure_pip, python3};

use crate::paths::repo_root;
use crate::process::{cargo, output, run};

/// The CUDA wheels (name, version): ptxas, and the NVRTC library.
const WHEELS: [(&str, &str); 2] = [
    ("nvidia-cuda-nvcc-cu12", "12.9.86"),
    ("nvidia-cuda-nvrtc-cu12", "12.9.86"),
];

/// One kernel's resources as ptxas reports them.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelUse {
    pub name: String,
    pub registers: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// The folder with the unpacked wheels, fetched on first use.
fn toolkit() -> Result<PathBuf> {
    let models = model_cache::models_cache_dir().context("no cache folder ($HOME unset?)")?;
    let dir = models
        .parent()
        .context("the models cache has no parent folder")?
        .join("cuda-wheels");
    let done = dir.join(format!("unpacked-{}", WHEELS[0].1));
    if done.exists() {
        return Ok(dir);
    }
    let python = python3();
    ensure_pip(&python).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::create_dir_all(&dir)?;
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "download", "--no-deps", "-d"])
        .arg(&dir);
    for (name, version) in WHEELS {
        pip.arg(format!("{name}=={version}"));
    }
    run(&mut pip)?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            run(Command::new(&python)
                .args(["-m", "zipfile", "-e"])
                .arg(&path)
                .arg(&dir))?;
        }
    }
    // cudarc opens `libnvrtc.so`; the wheel has the versioned name only.
    let lib = nvrtc_dir(&dir);
    let link = lib.join("libnvrtc.so");
    if !link.exists() {
        std::os::unix::fs::symlink("libnvrtc.so.12", &link)?;
    }
    std::fs::set_permissions(
        ptxas_bin(&dir),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    std::fs::write(&done, "")?;
    Ok(dir)
}

fn nvrtc_dir(toolkit: &Path) -> PathBuf {
    toolkit.join("nvidia/cuda_nvrtc/lib")
}

fn ptxas_bin(toolkit: &Path) -> PathBuf {
    toolkit.join("nvidia/cuda_nvcc/bin/ptxas")
}

/// The kernels of `ptxas -v` output, in its order.
pub fn parse(report: &str) -> Vec<KernelUse> {
    let mut out: Vec<KernelUse> = Vec::new();
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelUse {
                name,
                registers: 0,
                stack_bytes: 0,
                spill_stores: 0,
                spill_loads: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if let Some(v) = number_before(line, "bytes stack frame") {
                k.stack_bytes = v;
            }
            if let Some(v) = number_before(line, "bytes spill stores") {
                k.spill_stores = v;
            }
            if let Some(v) = number_before(line, "bytes spill loads") {
                k.spill_loads = v;
            }
            if let Some(v) = line
                .split("Used ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
            {
                k.registers = v;
            }
        }
    }
    out
}

/// Compiles the program for `arch` (e.g. `sm_90`) and prints every kernel whose name contains
/// `filter` (all when empty), most registers first.
pub fn report(arch: &str, filter: &str) -> Result<()> {
    let Some(cc) = arch.strip_prefix("sm_").filter(|d| d.len() >= 2) else {
        bail!("--arch {arch}: expected sm_XY (e.g. sm_90)");
    };
    let (major, minor) = cc.split_at(cc.len() - 1);
    let kit = toolkit()?;
    let work = repo_root().join("target").join("ptxas");
    std::fs::create_dir_all(&work)?;
    let ptx = work.join(format!("program-{arch}.ptx"));
    run(Command::new(cargo())
        .current_dir(repo_root())
        .args([
            "run",
            "--release",
            "-q",
            "-p",
            "backend-cuda",
            "--example",
            "ptx",
            "--",
        ])
        .arg(&ptx)
        .arg(format!("{major}.{minor}"))
        .env("LD_LIBRARY_PATH", nvrtc_dir(&kit)))?;
    let out = output(
        Command::new(ptxas_bin(&kit))
            .args(["-v", &format!("-arch={arch}"), "-o", "/dev/null"])
            .arg(&ptx),
    )?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let mut kernels = parse(&text);
    if kernels.is_empty() {
        bail!("ptxas reported no kernel:\n{text}");
    }
    kernels.retain(|k| k.name.contains(filter));
    kernels.sort_by(|a, b| b.registers.cmp(&a.registers).then(a.name.cmp(&b.name)));
    println!("| kernel ({arch}) | registers | stack bytes | spill stores | spill loads |");
    println!("|---|---:|---:|---:|---:|");
    for k in &kernels {
        println!(
            "| {} | {} | {} | {} | {} |",
            k.name, k.registers, k.stack_bytes, k.spill_stores, k.spill_loads
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_are_read_per_kernel() {
        let report = "ptxas info    : 24 bytes gmem\n\
            ptxas info    : Compiling entry function 'k_a' for 'sm_90'\n\
            ptxas info    : Function properties for k_a\n    \
            288 bytes stack frame, 20 bytes spill stores, 24 bytes spill loads\n\
            ptxas info    : Used 128 registers, used 1 barriers, 304 bytes cumulative stack size\n\
            ptxas info    : Compiling entry function 'k_b' for 'sm_90'\n\
            ptxas info    : Function properties for k_b\n    \
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 8 registers, used 0 barriers\n";
        assert_eq!(
            parse(report),
            vec![
                KernelUse {
                    name: "k_a".into(),
                    registers: 128,
                    stack_bytes: 288,
                    spill_stores: 20,
                    spill_loads: 24,
                },
                KernelUse {
                    name: "k_b".into(),
                    registers: 8,
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0,
                },
            ]
        );
    }
}

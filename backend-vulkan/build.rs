//! Compiles the compute shaders in `shaders/` (GLSL; `#include "x.glsl"` lines are replaced by
//! `shaders/x.glsl`) to SPIR-V with glslang, in two variants: `fast` (16-bit storage and subgroup arithmetic) and `base`
//! (32-bit words and shared-memory reductions only). A shader with a `// @specialize WTYPE A B ...`
//! line is also compiled once per listed type as `<name>_<type in lower case>` with `WTYPE` defined
//! as `T_<type>` (weights of that type, F32 activations). Writes `$OUT_DIR/shaders.rs`, a table of
//! `(name, fast SPIR-V, base SPIR-V)`.

use glslang::{
    Compiler, CompilerOptions, ShaderInput, ShaderSource, ShaderStage, SpirvVersion, Target,
    VulkanVersion,
};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn compile(
    compiler: &Compiler,
    name: &str,
    source: &str,
    fast: bool,
    wtype: Option<&str>,
) -> Vec<u32> {
    let wtype = wtype.map(|t| format!("T_{t}"));
    let mut defines: Vec<(&str, Option<&str>)> = Vec::new();
    if fast {
        defines.push(("FAST", Some("1")));
    }
    if let Some(t) = &wtype {
        defines.push(("WTYPE", Some(t)));
    }
    let source = ShaderSource::from(source.to_string());
    let options = CompilerOptions {
        target: Target::Vulkan {
            version: VulkanVersion::Vulkan1_1,
            spirv_version: SpirvVersion::SPIRV1_3,
        },
        ..CompilerOptions::default()
    };
    let input = ShaderInput::new(
        &source,
        ShaderStage::Compute,
        &options,
        Some(&defines),
        None,
    )
    .unwrap_or_else(|e| panic!("shader {name}: {e}"));
    let shader = compiler
        .create_shader(input)
        .unwrap_or_else(|e| panic!("shader {name} (fast: {fast}): {e}"));
    shader
        .compile()
        .unwrap_or_else(|e| panic!("shader {name} (fast: {fast}): {e}"))
}

/// The weight types a shader asks to be specialized for (`// @specialize WTYPE ...`).
fn specializations(source: &str) -> Vec<String> {
    source
        .lines()
        .find_map(|l| l.trim().strip_prefix("// @specialize WTYPE "))
        .map(|types| types.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `source` with every `#include "file"` line replaced by that file of `dir` (expanded in turn).
fn expand(dir: &Path, source: &str) -> String {
    source
        .lines()
        .map(|line| match line.trim().strip_prefix("#include ") {
            Some(name) => {
                let name = name.trim().trim_matches('"');
                let text = std::fs::read_to_string(dir.join(name))
                    .unwrap_or_else(|e| panic!("shaders/{name}: {e}"));
                expand(dir, &text)
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() {
    let dir = Path::new("shaders");
    println!("cargo:rerun-if-changed=shaders");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("shaders/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".comp"))
        .collect();
    names.sort();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let compiler = Compiler::acquire().expect("glslang compiler");
    let mut table = String::from("/// (name, fast SPIR-V, base SPIR-V) of every shader.\npub const SHADERS: &[(&str, &[u8], &[u8])] = &[\n");
    for file in &names {
        let base_name = file.trim_end_matches(".comp");
        let body = std::fs::read_to_string(dir.join(file)).expect("shader source");
        let source = format!("#version 450\n{}\n", expand(dir, &body));
        let variants = std::iter::once(None).chain(specializations(&body).into_iter().map(Some));
        for wtype in variants {
            let name = match &wtype {
                Some(t) => format!("{base_name}_{}", t.to_lowercase()),
                None => base_name.to_string(),
            };
            let mut entry = format!("    (\"{name}\"");
            for (fast, variant) in [(true, "fast"), (false, "base")] {
                let words = compile(compiler, &name, &source, fast, wtype.as_deref());
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let path = out.join(format!("{name}_{variant}.spv"));
                std::fs::write(&path, bytes).expect("write SPIR-V");
                write!(entry, ", include_bytes!({:?})", path.display().to_string()).unwrap();
            }
            table += &entry;
            table += "),\n";
        }
    }
    table += "];\n";
    std::fs::write(out.join("shaders.rs"), table).expect("write shaders.rs");
}

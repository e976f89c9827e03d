//! The kernel sources the HIP backend shares with the CUDA backend: the CUDA backend's `cu/*.cu`
//! files, read at build time in the order of its `program_source()`, and the [`PENDING_EDITS`] that
//! make them vendor-neutral. Those edits belong in the sources themselves; until they are made there
//! (when the sources move to their shared home), [`portable_sources`] applies them while assembling
//! the program, and each edit whose text no longer occurs is reported by a test so that it can be
//! deleted here.

/// The CUDA backend's kernel sources, in its compilation order (`common.cu` first).
pub const SHARED_SOURCES: [(&str, &str); 8] = [
    (
        "common.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/common.cu"),
    ),
    (
        "elementwise.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/elementwise.cu"),
    ),
    (
        "norm.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/norm.cu"),
    ),
    (
        "rope.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/rope.cu"),
    ),
    (
        "rows.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/rows.cu"),
    ),
    (
        "sort.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/sort.cu"),
    ),
    (
        "attention.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/attention.cu"),
    ),
    (
        "matmul.cu",
        include_str!("../../../backend-cuda/src/kernels/cu/matmul.cu"),
    ),
];

/// A change to one shared source that removes a vendor-specific construct: every occurrence of
/// `find` becomes `replace`.
pub struct SourceEdit {
    pub file: &'static str,
    pub find: &'static str,
    pub replace: &'static str,
    /// Why the construct is vendor-specific and what the prelude provides instead.
    pub why: &'static str,
}

/// The edits the shared sources still need (to be made in the `.cu` files, then deleted here).
pub const PENDING_EDITS: &[SourceEdit] = &[
    SourceEdit {
        file: "common.cu",
        find: "__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));
    return h;
}
",
        replace: "",
        why: "inline PTX does not compile for AMD GPUs; each vendor prelude defines h2f/f2h \
              (PTX cvt on CUDA, _Float16 conversions on HIP)",
    },
    SourceEdit {
        file: "common.cu",
        find: "__shfl_xor_sync(0xffffffffu, v, o)",
        replace: "WARP_SHFL_XOR(v, o)",
        why: "__shfl_xor_sync with a 32-bit lane mask is CUDA's; HIP has __shfl_xor (its _sync \
              forms need a 64-bit mask and an opt-in macro)",
    },
    SourceEdit {
        file: "matmul.cu",
        find: "__shfl_xor_sync(0xffffffffu, s, o)",
        replace: "WARP_SHFL_XOR(s, o)",
        why: "as in common.cu",
    },
];

/// The shared sources as one translation unit, exactly as the CUDA backend assembles them.
pub fn shared_program() -> String {
    let texts: Vec<&str> = SHARED_SOURCES.iter().map(|(_, text)| *text).collect();
    texts.join("\n")
}

/// The shared sources with [`PENDING_EDITS`] applied, in order, named.
pub fn portable_sources() -> Vec<(&'static str, String)> {
    SHARED_SOURCES
        .iter()
        .map(|&(name, text)| {
            let text = PENDING_EDITS
                .iter()
                .filter(|e| e.file == name)
                .fold(text.to_string(), |t, e| t.replace(e.find, e.replace));
            (name, text)
        })
        .collect()
}

/// The kernel entry points (`extern "C" __global__ void NAME(`) of `program`, in source order.
pub fn entry_points(program: &str) -> Vec<&str> {
    const MARK: &str = "extern \"C\" __global__ void ";
    program
        .match_indices(MARK)
        .filter_map(|(at, _)| {
            let rest = &program[at + MARK.len()..];
            let name = &rest[..rest.find('(')?];
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pending_edit_still_applies() {
        for e in PENDING_EDITS {
            let (_, text) = SHARED_SOURCES
                .iter()
                .find(|(name, _)| *name == e.file)
                .unwrap_or_else(|| panic!("no shared source {}", e.file));
            assert!(
                text.contains(e.find),
                "{}: the text of a pending edit is gone (done in the sources?), delete it from \
                 PENDING_EDITS: {:?}",
                e.file,
                e.find
            );
        }
    }

    #[test]
    fn the_sources_are_the_cuda_backends() {
        assert_eq!(
            shared_program(),
            backend_cuda::kernels::program_source(),
            "the CUDA backend's kernel files changed: update SHARED_SOURCES"
        );
        let program = shared_program();
        let mut ours = entry_points(&program);
        let mut theirs = backend_cuda::kernels::KERNEL_NAMES.to_vec();
        ours.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(ours, theirs);
    }

    /// Constructs that only one vendor compiles (or that mean something else on the other), with
    /// what the shared sources use instead.
    const VENDOR_CONSTRUCTS: [(&str, &str); 10] = [
        ("asm(", "inline assembly: move it into the vendor preludes"),
        (
            "asm volatile",
            "inline assembly: move it into the vendor preludes",
        ),
        ("__shfl", "WARP_SHFL_XOR / WARP_SHFL_DOWN"),
        ("__syncwarp", "WARP_SYNC()"),
        (
            "__ballot",
            "no prelude name yet: ballots are 64-bit on CDNA",
        ),
        (
            "__activemask",
            "no prelude name yet: masks are 64-bit on CDNA",
        ),
        ("warpSize", "WARP_SIZE (a compile-time constant)"),
        ("cuda_fp16", "h2f / f2h"),
        ("__half", "h2f / f2h on u16 bits"),
        ("__nv_bfloat16", "bf2f / f2bf on u16 bits"),
    ];

    #[test]
    fn the_portable_sources_hold_no_vendor_construct() {
        let mut found = Vec::new();
        for (name, text) in portable_sources() {
            for (line_no, line) in text.lines().enumerate() {
                for (construct, instead) in VENDOR_CONSTRUCTS {
                    if line.contains(construct) {
                        found.push(format!("{name}:{}: {construct} -> {instead}", line_no + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "vendor-specific constructs:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn entry_points_are_found_in_order() {
        let src = "extern \"C\" __global__ void k_a(int x) {}\n\
                   __device__ void helper() {}\n\
                   extern \"C\" __global__ void k_b(TD a, TD b) {}";
        assert_eq!(entry_points(src), ["k_a", "k_b"]);
        assert!(entry_points("extern \"C\" __global__ void ").is_empty());
    }

    #[test]
    fn the_edits_touch_only_what_they_name() {
        let shared = shared_program();
        let portable: Vec<String> = portable_sources().into_iter().map(|(_, t)| t).collect();
        let portable = portable.join("\n");
        assert_eq!(entry_points(&shared), entry_points(&portable));
        assert!(portable.len() < shared.len());
        assert!(!portable.contains("asm("));
    }
}

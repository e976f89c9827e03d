//! Direct GPU-to-GPU AllReduce for small messages: peer access between the devices, the staging
//! areas the one-shot kernel (`p2p.cu`, flag-carrying 8-byte words) pushes into, and its launches
//! on the participants' own streams (stream-ordered, no host round trip); plus the F32 <-> BF16
//! conversion kernels of the BF16 transport; and the same-GPU sum of logical devices (one context,
//! every rank's data addressable: one kernel on one stream sums and writes back every rank). The
//! kernels need compute capability 8.0 (BF16 conversions in PTX).

use crate::memory::CudaBuffer;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::{sys, CudaContext, CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use ggml_core::{DType, Device as _, Error, Result};
use std::sync::Arc;

/// The kernel source.
pub const SOURCE: &str = include_str!("p2p.cu");
/// `AR_MAX_RANKS` of `p2p.cu`.
pub const MAX_RANKS: usize = 8;
/// Threads per block of the one-shot kernel (one 8-byte word each), and most blocks: few enough to be
/// resident together on any GPU this runs on, so that no block waits for a peer block that cannot run.
const THREADS: u32 = 512;
const MAX_BLOCKS: usize = 128;
/// Bytes of a staging word: 32 payload bits and a 32-bit flag.
const WORD: usize = 8;

/// The communication kernels of one device.
pub struct CommKernels {
    ar_f32: CudaFunction,
    ar_f32_bf16: CudaFunction,
    ar_bf16: CudaFunction,
    to_bf16: CudaFunction,
    to_f32: CudaFunction,
    sum_f32: CudaFunction,
    sum_bf16: CudaFunction,
    sum_f16: CudaFunction,
}

impl CommKernels {
    /// Compiles `p2p.cu` for compute capability `cc` and loads it into `ctx`.
    pub fn compile(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> std::result::Result<Self, String> {
        if cc < (8, 0) {
            return Err(format!(
                "the communication kernels need sm_80 or newer, not sm_{}{}",
                cc.0, cc.1
            ));
        }
        crate::probe::guarded("NVRTC (p2p.cu)", || {
            let ptx = compile_ptx_with_opts(SOURCE, options(cc))
                .map_err(|e| format!("NVRTC compile of p2p.cu failed: {e:?}"))?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("loading p2p.cu: {e:?}"))?;
            let f = |name: &str| {
                module
                    .load_function(name)
                    .map_err(|e| format!("kernel {name}: {e:?}"))
            };
            Ok(CommKernels {
                ar_f32: f("k_ar_f32")?,
                ar_f32_bf16: f("k_ar_f32_bf16")?,
                ar_bf16: f("k_ar_bf16")?,
                to_bf16: f("k_f32_to_bf16")?,
                to_f32: f("k_bf16_to_f32")?,
                sum_f32: f("k_sum_f32")?,
                sum_bf16: f("k_sum_bf16")?,
                sum_f16: f("k_sum_f16")?,
            })
        })
    }
}

fn options(cc: (i32, i32)) -> CompileOptions {
    CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    }
}

/// `struct ArPeers`: the staging area of every rank, as addresses valid on every rank.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ArPeers {
    stage: [u64; MAX_RANKS],
}

// SAFETY: a plain `repr(C)` array of addresses with the layout of `struct ArPeers`.
unsafe impl DeviceRepr for ArPeers {}

/// What the one-shot kernel moves: the data's own type, or F32 data as BF16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    F32,
    F32AsBf16,
    Bf16,
}

impl Wire {
    /// Elements per staging word.
    fn per_word(self) -> usize {
        match self {
            Wire::F32 => 1,
            Wire::F32AsBf16 | Wire::Bf16 => 2,
        }
    }
}

/// Grid-stride launch shape of the conversion kernels.
fn convert_grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 1024) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Queues `dst[i] = bf16(src[i])` (or back to F32 when `to_f32`) for `n` elements on `be`'s stream.
pub fn convert(be: &CudaBackend, src: u64, dst: u64, n: usize, to_f32: bool) -> Result<()> {
    let k = be.cuda_device().comm_kernels()?;
    let f = if to_f32 { &k.to_f32 } else { &k.to_bf16 };
    let n64 = n as u64;
    let mut b = be.stream().launch_builder(f);
    b.arg(&src).arg(&dst).arg(&n64);
    // SAFETY: the caller passes `n`-element ranges of the two types on this device.
    cu("convert for the BF16 transport", unsafe {
        b.launch(convert_grid(n))
    })
    .map(|_| ())
}

/// Queues on `be`'s stream the sum of `n` elements of `dtype` (F32, BF16 or F16) at every address
/// of `ptrs` (memory of logical devices of `be`'s GPU, at most [`MAX_RANKS`]), written back to
/// every address. The caller orders the launch after the other ranks' work and theirs after it.
pub fn sum_same_gpu(be: &CudaBackend, ptrs: &[u64], dtype: DType, n: usize) -> Result<()> {
    if !(1..=MAX_RANKS).contains(&ptrs.len()) {
        return Err(err(format!(
            "same-GPU all-reduce over {} ranks (1 to {MAX_RANKS})",
            ptrs.len()
        )));
    }
    let k = be.cuda_device().comm_kernels()?;
    let f = match dtype {
        DType::F32 => &k.sum_f32,
        DType::BF16 => &k.sum_bf16,
        DType::F16 => &k.sum_f16,
        _ => {
            return Err(Error::UnsupportedType {
                dtype,
                what: "same-GPU all-reduce".into(),
            })
        }
    };
    let mut data = ArPeers::default();
    data.stage[..ptrs.len()].copy_from_slice(ptrs);
    let (nranks, n64) = (ptrs.len() as i32, n as u64);
    cu("bind context", be.cuda_device().context().bind_to_thread())?;
    let mut b = be.stream().launch_builder(f);
    b.arg(&data).arg(&nranks).arg(&n64);
    // SAFETY: the caller passes `n`-element ranges of `dtype` in this context, one per rank.
    cu("same-GPU all-reduce", unsafe { b.launch(convert_grid(n)) }).map(|_| ())
}

/// True when every device of `ctxs` can map every other's memory.
fn all_pairs_peer(ctxs: &[&Arc<CudaContext>]) -> Result<bool> {
    for a in ctxs {
        for b in ctxs {
            if a.ordinal() == b.ordinal() {
                continue;
            }
            let mut can = 0;
            // SAFETY: valid out-pointer and device handles.
            cu("cuDeviceCanAccessPeer", unsafe {
                sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()).result()
            })?;
            if can == 0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Lets each context address every other's memory (idempotent).
fn enable_peer_access(ctxs: &[&Arc<CudaContext>]) -> Result<()> {
    for a in ctxs {
        cu("bind context", a.bind_to_thread())?;
        for b in ctxs {
            if a.ordinal() == b.ordinal() {
                continue;
            }
            // SAFETY: both contexts are live.
            let r = unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) };
            if r != sys::CUresult::CUDA_SUCCESS
                && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                return Err(err(format!(
                    "cuCtxEnablePeerAccess cuda:{} -> cuda:{}: {r:?}",
                    a.ordinal(),
                    b.ordinal()
                )));
            }
        }
    }
    Ok(())
}

/// The one-shot AllReduce over devices that reach each other's memory.
pub struct PeerReducer {
    backends: Vec<Arc<CudaBackend>>,
    stages: Vec<CudaBuffer>,
    peers: ArPeers,
    /// Words of one source's slot in a staging area.
    cap: usize,
}

impl PeerReducer {
    /// A reducer for messages of up to `max_bytes` bytes on the wire (4 per F32 element, 2 per
    /// BF16 one) over `backends` (distinct devices), or `None` when there are fewer than 2 or more
    /// than [`MAX_RANKS`] of them, a pair has no peer access, or the kernels do not build.
    pub fn new(backends: &[Arc<CudaBackend>], max_bytes: usize) -> Result<Option<Self>> {
        let n = backends.len();
        if !(2..=MAX_RANKS).contains(&n) || max_bytes == 0 {
            return Ok(None);
        }
        let ctxs: Vec<&Arc<CudaContext>> =
            backends.iter().map(|b| b.cuda_device().context()).collect();
        if !all_pairs_peer(&ctxs)?
            || backends
                .iter()
                .any(|b| b.cuda_device().comm_kernels().is_err())
        {
            return Ok(None);
        }
        enable_peer_access(&ctxs)?;
        // A word carries 4 bytes of data (one F32, or two BF16).
        let cap = max_bytes.div_ceil(4).next_multiple_of(32);
        let mut peers = ArPeers::default();
        let stages = backends
            .iter()
            .map(|b| {
                let dev = b.cuda_device();
                CudaBuffer::new(
                    dev.pool(),
                    format!("{} all-reduce staging", dev.name()),
                    2 * n * cap * WORD,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        for (slot, s) in peers.stage.iter_mut().zip(&stages) {
            *slot = s.device_ptr();
        }
        Ok(Some(PeerReducer {
            backends: backends.to_vec(),
            stages,
            peers,
            cap,
        }))
    }

    /// Largest message in elements of `wire` this reducer takes.
    pub fn max_count(&self, wire: Wire) -> usize {
        self.cap * wire.per_word()
    }

    /// Queues the sum of `count` elements at `ptrs[i]` (device `i`) on every participant's stream;
    /// `call` counts the calls of this reducer (1, 2, ...: consecutive calls alternate slots).
    pub fn all_reduce(&self, ptrs: &[u64], count: usize, wire: Wire, call: u64) -> Result<()> {
        if count > self.max_count(wire) {
            return Err(err(format!(
                "one-shot all-reduce of {count} elements: the staging holds {}",
                self.max_count(wire)
            )));
        }
        let words = count.div_ceil(wire.per_word());
        let blocks = words.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let nranks = self.backends.len() as i32;
        let (n, cap) = (count as u64, self.cap as u64);
        // Any flag but 0 (the value of consumed words) marks a live word.
        let flag = (call % u32::MAX as u64) as u32 + 1;
        let slot = (call & 1) as u32;
        for (rank, (be, &ptr)) in self.backends.iter().zip(ptrs).enumerate() {
            let k = be.cuda_device().comm_kernels()?;
            let f = match wire {
                Wire::F32 => &k.ar_f32,
                Wire::F32AsBf16 => &k.ar_f32_bf16,
                Wire::Bf16 => &k.ar_bf16,
            };
            let rank = rank as i32;
            cu("bind context", be.cuda_device().context().bind_to_thread())?;
            let mut b = be.stream().launch_builder(f);
            b.arg(&ptr)
                .arg(&n)
                .arg(&rank)
                .arg(&nranks)
                .arg(&self.peers)
                .arg(&cap)
                .arg(&flag)
                .arg(&slot);
            // SAFETY: `ptr` holds `count` elements on this rank's device (checked by the caller);
            // the staging areas hold `count` wire elements per slot and source (checked above).
            cu("one-shot all-reduce", unsafe { b.launch(cfg) })?;
        }
        Ok(())
    }
}

impl Drop for PeerReducer {
    fn drop(&mut self) {
        // A rank's kernel may still push into a peer's staging: let every stream finish first.
        for b in &self.backends {
            let _ = ggml_core::Backend::synchronize(b.as_ref());
        }
        self.stages.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_declares_what_rust_launches() {
        for name in [
            "k_ar_f32(",
            "k_ar_f32_bf16(",
            "k_ar_bf16(",
            "k_f32_to_bf16(",
            "k_bf16_to_f32(",
            "k_sum_f32(",
            "k_sum_bf16(",
            "k_sum_f16(",
        ] {
            assert!(SOURCE.contains(name), "{name}");
        }
        assert!(SOURCE.contains(&format!("#define AR_MAX_RANKS {MAX_RANKS}")));
        assert_eq!(std::mem::size_of::<ArPeers>(), 8 * MAX_RANKS);
    }

    #[test]
    fn nvrtc_compiles_the_kernels_when_present() {
        // SAFETY: only opens the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: no NVRTC library");
            return;
        }
        let ptx = compile_ptx_with_opts(SOURCE, options((9, 0)));
        assert!(ptx.is_ok(), "{ptx:?}");
    }
}

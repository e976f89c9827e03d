//! [`CpuCommunicator`]: the AllReduce (sum) between virtual CPU devices, in place over their host
//! buffers with no staging copies. Elements are summed a block at a time in a local f32 accumulator
//! (loads and stores are plain copies, so any alignment works and the adds vectorize); large tensors
//! spread their blocks over the calling thread's pool.

use ggml_core::{Communicator, DType, DataRef, Error, Result};
use rayon::prelude::*;

/// Elements summed at once.
const BLOCK: usize = 1024;
/// From this many elements up, blocks are summed in parallel.
const PARALLEL_MIN: usize = 64 * BLOCK;

/// AllReduce over host buffers of the participating CPU streams. Sums are taken in f32 in
/// participant order, so every participant ends with identical bytes. Stream-ordered: a CPU
/// stream's work is complete when `compute` returns, so once every participant's `compute` has
/// returned the sum can start, and it is complete when the call returns.
pub struct CpuCommunicator {
    size: usize,
}

impl CpuCommunicator {
    pub fn new(size: usize) -> Self {
        CpuCommunicator { size }
    }
}

fn comm_err(msg: String) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        msg,
    }
}

impl Communicator for CpuCommunicator {
    fn size(&self) -> usize {
        self.size
    }
    fn is_stream_ordered(&self) -> bool {
        true
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        if data.len() != self.size {
            return Err(comm_err(format!(
                "all_reduce over {} buffers, communicator of {}",
                data.len(),
                self.size
            )));
        }
        if !dtype.is_float() {
            return Err(Error::UnsupportedType {
                dtype,
                what: "cpu all_reduce".into(),
            });
        }
        let len = count
            .checked_mul(dtype.type_size())
            .ok_or_else(|| comm_err(format!("all_reduce of {count} elements")))?;
        let mut ptrs = Vec::with_capacity(data.len());
        for d in data {
            ggml_core::backend::check_range(d.offset, len, d.buffer.size())?;
            let p = d
                .host_ptr()
                .ok_or_else(|| comm_err(format!("{} is not host memory", d.buffer.name())))?;
            ptrs.push(p as usize);
        }
        let block = |b: usize| {
            let start = b * BLOCK;
            // SAFETY: every participant holds `count` elements of `dtype` at its pointer (checked
            // above), and each block of elements is summed by one task only.
            unsafe { sum_block(&ptrs, dtype, start, (count - start).min(BLOCK)) }
        };
        let blocks = count.div_ceil(BLOCK);
        if count >= PARALLEL_MIN {
            (0..blocks).into_par_iter().for_each(block);
        } else {
            (0..blocks).for_each(block);
        }
        Ok(())
    }
}

/// Sums elements `start..start + len` (`len <= BLOCK`) of every participant in f32, in participant
/// order, and writes the sum back to every participant.
///
/// # Safety
/// Each pointer addresses at least `start + len` elements of `dtype` (F32, F16 or BF16), and no
/// other thread accesses those elements meanwhile.
unsafe fn sum_block(ptrs: &[usize], dtype: DType, start: usize, len: usize) {
    let mut acc = [0f32; BLOCK];
    let acc = &mut acc[..len];
    let mut halves = [0u16; BLOCK];
    let halves = &mut halves[..len];
    let to_f32 = |bits: u16| match dtype {
        DType::F16 => half::f16::from_bits(bits).to_f32(),
        _ => half::bf16::from_bits(bits).to_f32(),
    };
    let from_f32 = |v: f32| match dtype {
        DType::F16 => half::f16::from_f32(v).to_bits(),
        _ => half::bf16::from_f32(v).to_bits(),
    };
    let mut tmp = [0f32; BLOCK];
    let tmp = &mut tmp[..len];
    for (k, &p) in ptrs.iter().enumerate() {
        let into: &mut [f32] = if k == 0 { &mut *acc } else { &mut *tmp };
        if dtype == DType::F32 {
            let src = (p as *const u8).add(start * 4);
            std::ptr::copy_nonoverlapping(src, into.as_mut_ptr().cast::<u8>(), len * 4);
        } else {
            let src = (p as *const u8).add(start * 2);
            std::ptr::copy_nonoverlapping(src, halves.as_mut_ptr().cast::<u8>(), len * 2);
            into.iter_mut()
                .zip(halves.iter())
                .for_each(|(v, &h)| *v = to_f32(h));
        }
        if k > 0 {
            acc.iter_mut().zip(tmp.iter()).for_each(|(a, t)| *a += t);
        }
    }
    if dtype != DType::F32 {
        halves
            .iter_mut()
            .zip(acc.iter())
            .for_each(|(h, &v)| *h = from_f32(v));
    }
    for &p in ptrs {
        if dtype == DType::F32 {
            let dst = (p as *mut u8).add(start * 4);
            std::ptr::copy_nonoverlapping(acc.as_ptr().cast::<u8>(), dst, len * 4);
        } else {
            let dst = (p as *mut u8).add(start * 2);
            std::ptr::copy_nonoverlapping(halves.as_ptr().cast::<u8>(), dst, len * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu_devices;
    use ggml_core::Device;
    use rand::Rng;

    /// `n` participants' random values at byte `offset` of their buffers, summed in place; returns
    /// each participant's bytes after the sum and the inputs as f32.
    fn reduce(
        n: usize,
        dtype: DType,
        count: usize,
        offset: usize,
    ) -> (Vec<Vec<u8>>, Vec<Vec<f32>>) {
        let mut rng = rand::thread_rng();
        let devs = cpu_devices(n, n).unwrap();
        let size = dtype.type_size();
        let mut inputs = Vec::new();
        let mut refs = Vec::new();
        for d in &devs {
            let vals: Vec<f32> = (0..count).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let bytes: Vec<u8> = match dtype {
                DType::F32 => bytemuck::cast_slice(&vals).to_vec(),
                DType::F16 => vals
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
                _ => vals
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
            };
            let b = d.buffer_type().alloc(offset + count * size + 8).unwrap();
            // Poison around the tensor: the sum must not touch it.
            b.fill(0, b.size(), 0xA5).unwrap();
            b.set(offset, &bytes).unwrap();
            inputs.push(decode(dtype, &bytes));
            refs.push(DataRef::new(b, offset));
        }
        CpuCommunicator::new(n)
            .all_reduce(&refs, dtype, count)
            .unwrap();
        let outs = refs
            .iter()
            .map(|r| {
                let mut all = vec![0u8; r.buffer.size()];
                r.buffer.get(0, &mut all).unwrap();
                assert!(
                    all[..offset].iter().all(|&b| b == 0xA5),
                    "before the tensor"
                );
                assert!(
                    all[offset + count * size..].iter().all(|&b| b == 0xA5),
                    "after"
                );
                all[offset..offset + count * size].to_vec()
            })
            .collect();
        (outs, inputs)
    }

    fn decode(dtype: DType, bytes: &[u8]) -> Vec<f32> {
        match dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|c| {
                    let bits = u16::from_le_bytes([c[0], c[1]]);
                    if dtype == DType::F16 {
                        half::f16::from_bits(bits).to_f32()
                    } else {
                        half::bf16::from_bits(bits).to_f32()
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn sums_in_participant_order_for_every_size_type_and_alignment() {
        for (n, dtype, count, offset) in [
            (2, DType::F32, 576, 0),
            (2, DType::F32, 3, 4),
            (3, DType::F32, BLOCK * 3 + 7, 2),
            (2, DType::F32, PARALLEL_MIN + 5, 64),
            (4, DType::F16, BLOCK + 1, 2),
            (2, DType::BF16, 1000, 6),
            (2, DType::F32, 0, 0),
        ] {
            let (outs, inputs) = reduce(n, dtype, count, offset);
            // The f32 sum in participant order, as the communicator promises.
            let want: Vec<f32> = (0..count)
                .map(|i| inputs.iter().skip(1).fold(inputs[0][i], |s, v| s + v[i]))
                .collect();
            let exact: Vec<f32> = (0..count)
                .map(|i| inputs.iter().map(|v| v[i] as f64).sum::<f64>() as f32)
                .collect();
            for out in &outs {
                assert_eq!(out, &outs[0], "every participant holds the same bytes");
            }
            let got = decode(dtype, &outs[0]);
            if dtype == DType::F32 {
                assert_eq!(got, want, "n {n} count {count}");
            }
            let num: f64 = got
                .iter()
                .zip(&exact)
                .map(|(g, e)| ((g - e) as f64).powi(2))
                .sum();
            let den: f64 = exact
                .iter()
                .map(|e| (*e as f64).powi(2))
                .sum::<f64>()
                .max(1e-30);
            let tol = if dtype == DType::F32 { 1e-12 } else { 1e-4 };
            assert!(
                num / den <= tol,
                "{dtype} n {n} count {count}: nmse {}",
                num / den
            );
        }
    }

    #[test]
    fn bad_calls_are_refused() {
        let devs = cpu_devices(2, 2).unwrap();
        let refs: Vec<DataRef> = devs
            .iter()
            .map(|d| DataRef::new(d.buffer_type().alloc(16).unwrap(), 0))
            .collect();
        let comm = CpuCommunicator::new(2);
        assert!(comm.all_reduce(&refs[..1], DType::F32, 4).is_err());
        assert!(comm.all_reduce(&refs, DType::F32, 5).is_err());
        assert!(comm.all_reduce(&refs, DType::F32, usize::MAX).is_err());
        assert!(matches!(
            comm.all_reduce(&refs, DType::I32, 4),
            Err(Error::UnsupportedType { .. })
        ));
    }
}

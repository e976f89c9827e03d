//! Same-type `cont` of strided slices of every block type the shaders know (what the meta backend
//! asks for when it slices quantized weights): the copy must move the blocks bit for bit, for even
//! block sizes (16-bit words) and odd ones (MXFP4, byte by byte), in both shader variants.

use backend_vulkan::{open_devices_with, Variant};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, Device, Graph};

const BLOCK_TYPES: [DType; 9] = [
    DType::Q4_0,
    DType::Q8_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::MXFP4,
];

/// Pseudo-random bytes (a block copy does not look at the values).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn block_cont_of_strided_slices_copies_bits() {
    for variant in [Variant::Auto, Variant::Base] {
        let devices = match open_devices_with(1, variant) {
            Ok(d) => d,
            Err(reason) => {
                println!("skipped: no vulkan device ({reason})");
                return;
            }
        };
        let backend = devices[0].new_backend().expect("backend");
        for (k, t) in BLOCK_TYPES.into_iter().enumerate() {
            // [3 blocks, 5 rows, 2 planes]; the slice keeps rows 1..4 of every plane.
            let (blocks, rows, planes) = (3, 5, 2);
            let mut g = Graph::new();
            let leaf = g
                .new_input(t, &[blocks * t.block_size(), rows, planes])
                .unwrap();
            let l = *g.layout(leaf);
            let slice = g
                .view(leaf, &[l.ne[0], 3, planes], &l.nb[1..3], l.nb[1])
                .unwrap();
            let out = g.cont(slice).unwrap();
            g.output(out);
            let mut sched = Scheduler::new(vec![backend.clone()]);
            sched.alloc(&mut g).unwrap();
            let src = bytes(l.nbytes(), 0x9E37 + k as u64);
            g.set_bytes(leaf, &src).unwrap();
            let d = g.data(out).unwrap();
            d.buffer
                .fill(d.offset, g.layout(out).nbytes(), 0xFF)
                .unwrap();
            sched.compute(&g).unwrap();
            let row = l.nb[1];
            let want: Vec<u8> = (0..planes)
                .flat_map(|p| src[p * l.nb[2] + row..p * l.nb[2] + 4 * row].to_vec())
                .collect();
            assert_eq!(g.get_bytes(out).unwrap(), want, "{t} ({variant:?})");
        }
    }
}

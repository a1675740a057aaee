//! The linear's gated epilogue (`linear_io.wgsl`'s `GATED`), held bit for
//! bit to what it replaces: the linear into a scratch, then the element-wise
//! gated residual of the scratch into the stream, on every tier and kernel
//! shape the adapter has.

use crate::kernels::elementwise::{elementwise, Elementwise};
use crate::kernels::linear::{linear_from, linear_gated, Gemm, Input};
use crate::testing::*;
use crate::view::{Mat, Weight};
use crate::{Gpu, GpuOptions, Precision};

/// `stream += gate ⊙ (x·Wᵀ (+ b))` both ways on `gpu`, the stream a column
/// window of a wider tensor, with and without a bias: the same bits.
fn check_gated(gpu: &Gpu, [m, n, k]: [usize; 3]) {
    let mut rng = Rng::new((m * 7 + n * 3 + k) as u64);
    let wide = n + 5;
    let x = rng.normals(m * k, 1.0);
    let stream = rng.normals(m * wide, 3.0);
    let gate = rng.normals(n + 2, 1.0);
    let (xb, wb, bb, gb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &rng.bf16s(n * k, 0.1)), gpu.upload_bf16("b", &rng.bf16s(n, 1.0)), gpu.upload_f32("gate", &gate));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    for with_bias in [false, true] {
        let bias = with_bias.then(|| Weight::bf16(&bb));
        let run = |fused: bool| {
            let sb = gpu.upload_f32("stream", &stream);
            let scratch = poisoned(gpu, m * n);
            let stream_rows = Mat::new(&sb, wide as u64).cols_from(3);
            let gate_row = Mat { buf: &gb, offset: 2, stride: 0 };
            run_and_read(gpu, &sb, m * wide, |enc| {
                if fused {
                    return linear_gated(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), bias, stream_rows, gate_row, s);
                }
                linear_from(gpu, enc, Input::F32(Mat::new(&xb, k as u64)), Weight::bf16(&wb), bias, Mat::new(&scratch, n as u64), s)?;
                elementwise(gpu, enc, Elementwise::GatedResidual, Mat::new(&scratch, n as u64), Some(gate_row), stream_rows, [m as u64, n as u64])
            })
        };
        let (fused, apart) = (run(true), run(false));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&apart), "{m}×{k}·{k}×{n}, bias {with_bias}, on {}", gpu.precision().name());
        assert_ne!(bits(&fused), bits(&stream), "the stream took the product");
    }
}

#[test]
fn the_gated_epilogue_equals_the_product_then_the_gated_residual() {
    // The lanes kernel (x's rows on whole vec4s, k a multiple of 8) and the tiled one.
    each_kernel_shape(gpu(), options(), |g| {
        check_gated(g, [37, 70, 64]);
        check_gated(g, [37, 70, 36]);
    });
}

#[test]
fn the_gated_epilogue_equals_the_product_then_the_gated_residual_on_f16_tiles() {
    let Some(gpu) = half_gpu() else { return };
    check_gated(&gpu, [37, 70, 64]);
}

#[test]
fn the_gated_epilogue_equals_the_product_then_the_gated_residual_on_matrix_units() {
    let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, ..options() }) else { return };
    check_gated(&gpu, [70, 131, 64]);
    check_gated(&gpu, [13, 70, 36]);
}

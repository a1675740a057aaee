//! The linear's epilogues, each held bit for bit to what it replaces: the
//! gated residual (`linear_io.wgsl`'s `GATED`: the linear into a scratch,
//! then the element-wise gated residual of the scratch into the stream) and
//! SwiGLU (`SWIGLU`: the gate and up products into a scratch, then the
//! element-wise SwiGLU), on every tier and kernel shape the adapter has.

use crate::kernels::elementwise::{elementwise, Elementwise};
use crate::kernels::linear::{linear_add, linear_from, linear_gated, linear_swiglu, measure_weight_rows, stores_vec4s, Gemm, Input};
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

/// `y = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)` both ways on `gpu`: W's gate and up
/// rows `first ..` of a taller weight, `y` a column window of a wider
/// tensor. With `kept`, W's row scales measured once beforehand, as a
/// weight reaching the device keeps them (the matrix tier reads them).
fn check_swiglu(gpu: &Gpu, [m, n, k]: [usize; 3], kept: bool) {
    let mut rng = Rng::new((m * 5 + n * 11 + k) as u64);
    let (first, wide) = (3usize, n + 7);
    let rows = first + 2 * n + 2;
    let x = rng.normals(m * k, 1.0);
    let (xb, wb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &rng.bf16s(rows * k, 0.1)));
    let before = rng.normals(m * wide, 1.0);
    let scales = gpu.storage("weight row scales", 4 * rows as u64);
    if kept {
        let mut measure: Vec<crate::Dispatch> = Vec::new();
        measure_weight_rows(gpu, &mut measure, Weight::bf16(&wb), rows as u64, k as u64, &scales, 0).unwrap();
        gpu.submit(|enc| {
            crate::encode(enc, &measure);
            Ok(())
        })
        .unwrap();
    }
    let weight = match kept {
        true => Weight { scales: Some(crate::RowScales { buf: &scales, offset: 0, k: k as u64, packed: false }), ..Weight::bf16(&wb) },
        false => Weight::bf16(&wb),
    }
    .rows_from(first as u64, k as u64);
    let run = |fused: bool| {
        let yb = gpu.upload_f32("y", &before);
        let scratch = poisoned(gpu, m * 2 * n);
        let y = Mat::new(&yb, wide as u64).cols_from(4);
        let x = Input::F32(Mat::new(&xb, k as u64));
        run_and_read(gpu, &yb, m * wide, |enc| {
            if fused {
                return linear_swiglu(gpu, enc, x, weight, y, Gemm { m: m as u64, n: n as u64, k: k as u64 });
            }
            let both = Mat::new(&scratch, 2 * n as u64);
            linear_from(gpu, enc, x, weight, None, both, Gemm { m: m as u64, n: 2 * n as u64, k: k as u64 })?;
            elementwise(gpu, enc, Elementwise::SwiGlu, both, Some(both.cols_from(n as u64)), y, [m as u64, n as u64])
        })
    };
    let (fused, apart) = (run(true), run(false));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused), bits(&apart), "SwiGLU {m}×{k}·{k}×2·{n}, kept scales {kept}, on {}", gpu.precision().name());
    let written = (0..m).all(|r| (4..4 + n).all(|c| fused[r * wide + c].to_bits() != before[r * wide + c].to_bits()));
    assert!(written, "every output of the window written");
}

#[test]
fn the_swiglu_epilogue_equals_the_product_then_the_swiglu() {
    // The lanes kernel (k a multiple of 8), the tiled one, and the tiled
    // kernel's 64-row shape; n past one and several column blocks.
    each_kernel_shape(gpu(), options(), |g| {
        check_swiglu(g, [37, 70, 64], false);
        check_swiglu(g, [37, 200, 36], false);
        check_swiglu(g, [130, 45, 40], false);
    });
}

#[test]
fn the_swiglu_epilogue_equals_the_product_then_the_swiglu_on_f16_tiles() {
    let Some(gpu) = half_gpu() else { return };
    check_swiglu(&gpu, [37, 70, 64], false);
    check_swiglu(&gpu, [130, 200, 36], false);
}

#[test]
fn the_swiglu_epilogue_equals_the_product_then_the_swiglu_on_matrix_units() {
    let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, ..options() }) else { return };
    // vec4 fetching (k = 64) and element fetching (k = 36), W's scales kept or measured per product.
    for kept in [false, true] {
        check_swiglu(&gpu, [70, 131, 64], kept);
        check_swiglu(&gpu, [13, 70, 36], kept);
    }
    crate::kernels::linear::tests::with_element_fetch(|| check_swiglu(&gpu, [70, 131, 64], true));
}

/// The matrix linear's outputs written four at a time (y's window and rows
/// whole vec4s: `stores_vec4s`) and one at a time (neither): the same bits,
/// with a bias, added onto y, gated onto it, and as SwiGLU's.
fn check_vector_stores(gpu: &Gpu, [m, n, k]: [usize; 3]) {
    let mut rng = Rng::new((m * 13 + n * 7 + k) as u64);
    let x = rng.normals(m * k, 1.0);
    let old = rng.normals(m * n, 2.0);
    let (xb, wb, bb, gb) = (gpu.upload_f32("x", &x), gpu.upload_bf16("w", &rng.bf16s(2 * n * k, 0.1)), gpu.upload_bf16("b", &rng.bf16s(n, 1.0)), gpu.upload_f32("gate", &rng.normals(n, 1.0)));
    let s = Gemm { m: m as u64, n: n as u64, k: k as u64 };
    let x_rows = Mat::new(&xb, k as u64);
    let gate_row = Mat { buf: &gb, offset: 0, stride: 0 };
    let vec4_stride = n.next_multiple_of(4) + 4;
    // y from output `at` of rows `stride` apart, holding `old` first.
    let run = |epilogue: &str, at: usize, stride: usize| -> Vec<u32> {
        let mut before = vec![f32::NAN; at + m * stride];
        (0..m).for_each(|r| before[at + r * stride..at + r * stride + n].copy_from_slice(&old[r * n..(r + 1) * n]));
        let yb = gpu.upload_f32("y", &before);
        let y = Mat { buf: &yb, offset: at as u64, stride: stride as u64 };
        let all = run_and_read(gpu, &yb, before.len(), |enc| match epilogue {
            "bias" => linear_from(gpu, enc, Input::F32(x_rows), Weight::bf16(&wb), Some(Weight::bf16(&bb)), y, s),
            "accumulate" => linear_add(gpu, enc, x_rows, Weight::bf16(&wb), y, s),
            "gated" => linear_gated(gpu, enc, Input::F32(x_rows), Weight::bf16(&wb), Some(Weight::bf16(&bb)), y, gate_row, s),
            _ => linear_swiglu(gpu, enc, Input::F32(x_rows), Weight::bf16(&wb), y, s),
        });
        (0..m).flat_map(|r| (0..n).map(move |c| (r, c))).map(|(r, c)| all[at + r * stride + c].to_bits()).collect()
    };
    assert!(stores_vec4s(4, vec4_stride as u64, n as u64) && !stores_vec4s(3, vec4_stride as u64 + 1, n as u64));
    for epilogue in ["bias", "accumulate", "gated", "swiglu"] {
        let (quads, singles) = (run(epilogue, 4, vec4_stride), run(epilogue, 3, vec4_stride + 1));
        assert_eq!(quads, singles, "{epilogue}: {m}×{k}·{k}×{n} four outputs a store and one");
        assert!(quads.iter().all(|b| f32::from_bits(*b).is_finite()), "{epilogue}: every output written");
    }
}

#[test]
fn the_matrix_linears_vector_stores_give_its_element_stores_bits() {
    let Some(gpu) = tier_gpu_with(GpuOptions { precision: Precision::Matrix, ..options() }) else { return };
    // Rows past a block, whole column blocks and a last quad partly past the matrix.
    check_vector_stores(&gpu, [70, 70, 64]);
}

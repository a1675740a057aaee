//! `flux_lite_core::numerics::rng::TorchGenerator` against `torch.randn` on a CPU
//! generator: `goldens/noise.safetensors` (written by
//! `test_vectors/generate_numerics.py`) and the initial noise of every
//! diffusers golden run. Everything is compared bit for bit.

#![allow(clippy::unwrap_used)]

use flux_lite_core::numerics::rng::TorchGenerator;
use flux_lite_tests::{test_vectors, Goldens, CASES};
use safetensors::tensor::{Dtype, SafeTensors};

/// Draws `n` values of the given dtype from `g` and returns their bit
/// patterns widened to u32 (bf16 stays in the low 16 bits).
fn draw(g: &mut TorchGenerator, dtype: Dtype, n: usize) -> Vec<u32> {
    match dtype {
        Dtype::F32 => {
            let mut out = vec![0f32; n];
            g.fill_randn_f32(&mut out);
            out.iter().map(|v| v.to_bits()).collect()
        }
        Dtype::BF16 => {
            let mut out = vec![0u16; n];
            g.fill_randn_bf16(&mut out);
            out.iter().map(|&v| u32::from(v)).collect()
        }
        other => panic!("unexpected dtype {other:?}"),
    }
}

/// The stored tensor's bit patterns, in the same form as [`draw`].
fn stored(dtype: Dtype, data: &[u8]) -> Vec<u32> {
    match dtype {
        Dtype::F32 => data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
        other => panic!("unexpected dtype {other:?}"),
    }
}

fn first_mismatch(got: &[u32], want: &[u32]) -> Option<usize> {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).position(|(a, b)| a != b)
}

fn noise_file() -> Vec<u8> {
    let path = test_vectors().join("goldens/noise.safetensors");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run test_vectors/generate_numerics.py)", path.display()))
}

#[test]
fn fresh_generators_match_torch_randn() {
    let bytes = noise_file();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut checked = 0;
    for (name, view) in st.tensors() {
        let parts: Vec<&str> = name.split('/').collect();
        if parts[0] != "randn" {
            continue;
        }
        // randn/<dtype>/<seed>/<shape>
        let seed: u64 = parts[2].parse().unwrap();
        let shape: Vec<usize> = parts[3].split('x').map(|d| d.parse().unwrap()).collect();
        assert_eq!(view.shape(), &shape[..], "{name}");
        let n = shape.iter().product();
        let want = stored(view.dtype(), view.data());
        let got = draw(&mut TorchGenerator::new(seed), view.dtype(), n);
        if let Some(i) = first_mismatch(&got, &want) {
            panic!("{name}: element {i} is {:#x}, torch has {:#x}", got[i], want[i]);
        }
        checked += 1;
    }
    // 4 seeds × 12 shapes × 2 dtypes.
    assert_eq!(checked, 96);
}

#[test]
fn successive_calls_continue_the_stream() {
    let bytes = noise_file();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut calls: Vec<(u64, usize, String)> = st
        .names()
        .into_iter()
        .filter(|n| n.starts_with("sequence/"))
        .map(|n| {
            let parts: Vec<&str> = n.split('/').collect();
            (parts[1].parse().unwrap(), parts[2].parse().unwrap(), n.to_string())
        })
        .collect();
    calls.sort();
    assert!(calls.len() >= 2);
    let mut g = TorchGenerator::new(calls[0].0);
    for (seed, _, name) in &calls {
        assert_eq!(*seed, calls[0].0);
        let view = st.tensor(name).unwrap();
        let n = view.shape().iter().product();
        let want = stored(view.dtype(), view.data());
        let got = draw(&mut g, view.dtype(), n);
        if let Some(i) = first_mismatch(&got, &want) {
            panic!("{name}: element {i} is {:#x}, torch has {:#x}", got[i], want[i]);
        }
    }
}

/// The golden runs draw `torch.randn((1, C, h, w), bf16)` and pack it to
/// [S, C] with token `y·w + x`.
#[test]
fn pipeline_noise_matches_the_goldens() {
    for case in CASES {
        let g = Goldens::load(case);
        let json = g.case_json();
        let seed = json["seed"].as_u64().unwrap();
        let shape: Vec<usize> =
            json["noise_shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(shape[0], 1, "{case}");
        let (c, hw) = (shape[1], shape[2] * shape[3]);
        let mut raw = vec![0u16; c * hw];
        TorchGenerator::new(seed).fill_randn_bf16(&mut raw);
        let mut packed = vec![0f32; hw * c];
        for ch in 0..c {
            for token in 0..hw {
                packed[token * c + ch] = flux_lite_core::numerics::bf16::to_f32(raw[ch * hw + token]);
            }
        }
        let (want, want_shape) = g.f32("noise");
        assert_eq!(want_shape, [hw, c], "{case}");
        let got: Vec<u32> = packed.iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        if let Some(i) = first_mismatch(&got, &want) {
            panic!("{case}: noise element {i} is {:#x}, torch has {:#x}", got[i], want[i]);
        }
    }
}

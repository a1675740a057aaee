//! Unit tests of the DF11 codec: round trips through our encoder and decoder, the error of
//! every broken invariant, and a literal model of the official kernel that the decoder must
//! match on any input `Df11Group::new` accepts (proptest).

mod invalid;
mod kernel_model;
mod round_trip;

use super::{Df11Group, Df11GroupBuf};

/// splitmix64: deterministic test data without a dependency.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Roughly normal (sum of four uniforms), times `scale`.
    pub(super) fn normal(&mut self, scale: f32) -> f32 {
        let sum: f64 = (0..4).map(|_| (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64).sum();
        (sum - 2.0) as f32 * scale * 1.7
    }

    /// bf16 weights like a linear's: roughly N(0, scale²).
    pub(super) fn weights(&mut self, n: usize, scale: f32) -> Vec<u16> {
        (0..n).map(|_| crate::numerics::bf16::from_f32(self.normal(scale))).collect()
    }

    /// Words with the given exponents and random sign and mantissa.
    pub(super) fn words_with_exponents(&mut self, exponents: &[u8]) -> Vec<u16> {
        exponents.iter().map(|&e| super::bf16_from_parts(e, self.next_u64() as u8)).collect()
    }

    pub(super) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// Decodes a group with `decode_into`.
pub(super) fn decode(group: &Df11Group<'_>) -> Vec<u16> {
    let mut out = vec![0xdead; group.n_elements()];
    group.decode_into(&mut out).expect("output has the group's length");
    out
}

/// Encodes, checks the view, decodes and compares with the input; returns the group.
pub(super) fn round_trip(weights: &[&[u16]]) -> Df11GroupBuf {
    let buf = Df11GroupBuf::encode(weights).expect("encodable weights");
    check_decodes_to(&buf, weights);
    buf
}

pub(super) fn check_decodes_to(buf: &Df11GroupBuf, weights: &[&[u16]]) {
    let group = buf.group().expect("our encoder writes valid groups");
    let want: Vec<u16> = weights.concat();
    let got = decode(&group);
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!("element {i} of {}: decoded {:#06x}, want {:#06x}", want.len(), got[i], want[i]);
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(kernel_model::decode(&buf.fields()), want, "the kernel model disagrees");
}

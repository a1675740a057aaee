// Shared helpers, prepended to every kernel module.
//
// Activation inputs are declared read_write although kernels only read them:
// activations share one arena buffer, and a dispatch may not bind one buffer
// both read-only and writable. Weights and tables, in buffers of their own,
// stay read-only.

// Element `i` of a bf16 array packed two per u32 (even index in the low half).
fn bf16_at(word: u32, i: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

// Weight buffers hold bf16 pairs or f32 words: the word holding element `i`,
// and the element's value from that word.
fn weight_word(i: u32, bf16: bool) -> u32 {
    return select(i, i >> 1u, bf16);
}

fn weight_value(word: u32, i: u32, bf16: bool) -> f32 {
    if (bf16) {
        return bf16_at(word, i);
    }
    return bitcast<f32>(word);
}

// Grids with more than 65535 workgroups wrap into y; this undoes the wrap.
fn flat_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// x·sigmoid(x), as torch's silu: SwiGLU's gate and the VAE's activation.
fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

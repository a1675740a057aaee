// GGML's quantized blocks (and scaled FP8) expanded into f32 elements of a weight slot,
// bit for bit as gguf-py's `dequantize` computes them in float32. Every
// product there is exact in f32 (an f16 scale's 11 bits times integers of
// at most 12 bits), so only a final `+ m` or `- dmin·m` rounds, once: an
// fma a compiler may form rounds the same. Each invocation expands one
// run of 32 consecutive elements (a whole Q4_0…Q8_0 block, an eighth of a
// K-quant super-block). Blocks are byte arrays of odd lengths (18, 22, 34,
// 110, 210 bytes), so the source is read a byte at a time from u32 words.

struct Params {
    // GGML type id (2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10…14 Q2_K…Q6_K).
    kind: u32,
    // Runs of 32 elements this dispatch writes.
    runs: u32,
    // Byte of the bound source where the dispatch's first block starts.
    src_shift: u32,
    // Element of the bound output where its first element lands.
    out_shift: u32,
    // FP8's per-tensor scale (GGML blocks carry their own).
    scale: f32,
    // Elements this dispatch writes (FP8's last run may be short).
    count: u32,
    // ggml_expand_half's: elements a row (whole runs), and the element of
    // its bound scales where the dispatch's first row's scale lands.
    row_elements: u32,
    scales_shift: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

fn byte_at(i: u32) -> u32 {
    let k = p.src_shift + i;
    return (src[k >> 2u] >> ((k & 3u) * 8u)) & 0xffu;
}

// An IEEE half at byte `i` as f32, exactly (subnormals included, which
// unpack2x16float may flush).
fn half_at(i: u32) -> f32 {
    let h = byte_at(i) | (byte_at(i + 1u) << 8u);
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        let v = ldexp(f32(m), -24);
        return select(v, -v, sign != 0u);
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn signed_byte(b: u32) -> i32 {
    return i32(b) - select(0, 256, b >= 128u);
}

// Q4_K and Q5_K's 6-bit scale (`which` 0) or min (1) of sub-block `j` (0..7),
// from the 12 bytes at `at`.
fn k4_scale_min(at: u32, j: u32, which: u32) -> u32 {
    if j < 4u {
        return byte_at(at + j + 4u * which) & 0x3fu;
    }
    let packed = byte_at(at + 8u + j - 4u);
    let high = (byte_at(at + j - 4u + 4u * which) >> 2u) & 0x30u;
    return select(packed & 0x0fu, packed >> 4u, which == 1u) | high;
}

// Q3_K's signed scale of sub-block `i` (0..15), from the 12 bytes at `at`.
fn k3_scale(at: u32, i: u32) -> i32 {
    let low = (byte_at(at + (i & 7u)) >> (4u * (i >> 3u))) & 0x0fu;
    let high = (byte_at(at + 8u + (i & 3u)) >> (2u * (i >> 2u))) & 0x03u;
    return i32(low | (high << 4u)) - 32;
}

// The 32 elements of run `run` of the bound source (FP8's past p.count zero).
fn run_values(run: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    switch p.kind {
        case 2u, 3u, 6u, 7u, 8u: {
            // 32-element blocks: d (and m) as halves, then the values.
            let sizes = array<u32, 9>(0u, 0u, 18u, 20u, 0u, 0u, 22u, 24u, 34u);
            let b = run * sizes[p.kind];
            let d = half_at(b);
            if p.kind == 8u {
                for (var l = 0u; l < 32u; l++) {
                    v[l] = f32(signed_byte(byte_at(b + 2u + l))) * d;
                }
                return v;
            }
            let with_min = p.kind == 3u || p.kind == 7u;
            let m = select(0.0, half_at(b + 2u), with_min);
            let fifth = p.kind == 6u || p.kind == 7u;
            let qh_at = b + select(2u, 4u, with_min);
            let qh = byte_at(qh_at) | (byte_at(qh_at + 1u) << 8u) | (byte_at(qh_at + 2u) << 16u) | (byte_at(qh_at + 3u) << 24u);
            let qs = qh_at + select(0u, 4u, fifth);
            for (var l = 0u; l < 32u; l++) {
                var q = (byte_at(qs + (l & 15u)) >> (4u * (l >> 4u))) & 0x0fu;
                if fifth {
                    q |= ((qh >> l) & 1u) << 4u;
                }
                if with_min {
                    v[l] = d * f32(q) + m;
                } else {
                    v[l] = d * f32(i32(q) - select(8, 16, fifth));
                }
            }
        }
        case 10u: {
            // Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit values, d, dmin.
            let b = (run >> 3u) * 84u;
            let r = run & 7u;
            let d = half_at(b + 80u);
            let dmin = half_at(b + 82u);
            let qs = b + 16u + (r >> 2u) * 32u;
            let shift = 2u * (r & 3u);
            for (var half = 0u; half < 2u; half++) {
                let sc = byte_at(b + 2u * r + half);
                let dl = d * f32(sc & 0x0fu);
                let ml = dmin * f32(sc >> 4u);
                for (var l = 0u; l < 16u; l++) {
                    let k = half * 16u + l;
                    let q = (byte_at(qs + k) >> shift) & 3u;
                    v[k] = dl * f32(q) - ml;
                }
            }
        }
        case 11u: {
            // Q3_K: 32 bytes of high bits, 64 of 2-bit values, 12 of scales, d.
            let b = (run >> 3u) * 110u;
            let r = run & 7u;
            let d = half_at(b + 108u);
            let qs = b + 32u + (r >> 2u) * 32u;
            let shift = 2u * (r & 3u);
            for (var half = 0u; half < 2u; half++) {
                let dl = d * f32(k3_scale(b + 96u, 2u * r + half));
                for (var l = 0u; l < 16u; l++) {
                    let k = half * 16u + l;
                    let low = (byte_at(qs + k) >> shift) & 3u;
                    // A clear mask bit subtracts 4.
                    let high = ((byte_at(b + k) >> r) & 1u) ^ 1u;
                    v[k] = dl * f32(i32(low) - i32(high << 2u));
                }
            }
        }
        case 12u, 13u: {
            // Q4_K / Q5_K: d, dmin, 12 bytes of scales and mins, (32 bytes of fifth bits,) nibbles.
            let five = p.kind == 13u;
            let b = (run >> 3u) * select(144u, 176u, five);
            let r = run & 7u;
            let d = half_at(b) * f32(k4_scale_min(b + 4u, r, 0u));
            let dm = half_at(b + 2u) * f32(k4_scale_min(b + 4u, r, 1u));
            let qs = b + select(16u, 48u, five) + (r >> 1u) * 32u;
            let shift = 4u * (r & 1u);
            for (var l = 0u; l < 32u; l++) {
                var q = (byte_at(qs + l) >> shift) & 0x0fu;
                if five {
                    q |= ((byte_at(b + 16u + l) >> r) & 1u) << 4u;
                }
                v[l] = d * f32(q) - dm;
            }
        }
        case 14u: {
            // Q6_K: 128 bytes of low nibbles, 64 of high pairs, 16 signed scales, d.
            let b = (run >> 3u) * 210u;
            let r = run & 7u;
            let d = half_at(b + 208u);
            let h = r >> 2u;
            let ql = b + h * 64u + (r & 1u) * 32u;
            let low_shift = 4u * ((r >> 1u) & 1u);
            let qh = b + 128u + h * 32u;
            let high_shift = 2u * (r & 3u);
            for (var half = 0u; half < 2u; half++) {
                let dl = d * f32(signed_byte(byte_at(b + 192u + 2u * r + half)));
                for (var l = 0u; l < 16u; l++) {
                    let k = half * 16u + l;
                    let q = ((byte_at(ql + k) >> low_shift) & 0x0fu) | (((byte_at(qh + k) >> high_shift) & 3u) << 4u);
                    v[k] = dl * f32(i32(q) - 32);
                }
            }
        }
        case 248u: {
            // FP8 E4M3 (float8_e4m3fn), one byte a weight, times the tensor's scale.
            for (var l = 0u; l < 32u; l++) {
                let i = run * 32u + l;
                if i >= p.count {
                    return v;
                }
                v[l] = f8_e4m3(byte_at(i)) * p.scale;
            }
        }
        default: {}
    }
    return v;
}

@compute @workgroup_size(64)
fn ggml_expand(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let run = gid.x + gid.y * groups.x * 64u;
    if run >= p.runs {
        return;
    }
    let v = run_values(run);
    let o = p.out_shift + run * 32u;
    // GGML's runs are whole; FP8's last may be short.
    for (var l = 0u; l < min(32u, p.count - run * 32u); l++) {
        out[o + l] = v[l];
    }
}

// An FP8 E4M3 byte as f32, exactly (no infinities; S.1111.111 is NaN).
fn f8_e4m3(b: u32) -> f32 {
    let sign = (b & 0x80u) << 24u;
    let e = (b >> 3u) & 0x0fu;
    let m = b & 0x07u;
    if e == 15u && m == 7u {
        return bitcast<f32>(sign | 0x7fc00000u);
    }
    if e == 0u {
        let v = ldexp(f32(m), -9);
        return select(v, -v, sign != 0u);
    }
    return bitcast<f32>(sign | ((e + 120u) << 23u) | (m << 20u));
}

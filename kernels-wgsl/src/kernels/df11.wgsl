// DFloat11 expansion: one workgroup per 4096-byte block of a group's
// Huffman-coded exponent stream, writing the group's bf16 words (two per
// u32, little-endian) into a weight slot.
//
// The stream is cut into 64-bit segments; `gaps` gives, for each, the bit
// offset of the first code that starts in it, and `positions` the index of
// the first element of each block. A segment's codes are decoded twice:
// once to count them (a workgroup prefix sum then gives each segment its
// first element), once to write them. Each of the 256 invocations owns two
// adjacent segments. Byte arrays are bound as u32 words; every `*_shift`
// is the index of element 0 of the bound window in its buffer. Element i of
// the group lands at element out_base + i (even) of the slot buffer.

struct Params {
    n_luts: u32, n_bytes: u32, n_elements: u32, block0: u32,
    stream_shift: u32, sign_shift: u32, gaps_shift: u32, positions_shift: u32,
    out_base: u32, out_shift: u32, clear_first: u32, clear_end: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> luts: array<u32>;
@group(0) @binding(2) var<storage, read> stream: array<u32>;
@group(0) @binding(3) var<storage, read> sign_mantissa: array<u32>;
@group(0) @binding(4) var<storage, read> gaps: array<u32>;
@group(0) @binding(5) var<storage, read> positions: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>;

const THREADS: u32 = 256u;
const BLOCK_BYTES: u32 = 4096u;
// At most 17 decode tables and the lengths row, 256 bytes each, as words.
const LUT_WORDS: u32 = 1152u;

var<workgroup> lut: array<u32, 1152>;
var<workgroup> scan: array<u32, 256>;

fn byte_of(words: u32, i: u32) -> u32 {
    return (words >> (8u * (i & 3u))) & 0xffu;
}

fn lut_byte(row: u32, col: u32) -> u32 {
    let i = row * 256u + col;
    return byte_of(lut[i >> 2u], i);
}

// Byte k (global) of the exponent stream; zero past its end.
fn stream_byte(k: u32) -> u32 {
    if (k >= p.n_bytes) { return 0u; }
    let i = k - p.stream_shift;
    return byte_of(stream[i >> 2u], i);
}

// The 32 bits of the stream starting at bit `pos`, most significant first.
fn bits32(pos: u32) -> u32 {
    let k = pos >> 3u;
    let hi = (stream_byte(k) << 24u) | (stream_byte(k + 1u) << 16u) | (stream_byte(k + 2u) << 8u) | stream_byte(k + 3u);
    let r = pos & 7u;
    if (r == 0u) { return hi; }
    return (hi << r) | (stream_byte(k + 4u) >> (8u - r));
}

// (exponent, code length) of the code at bit `pos`: up to four table
// lookups, a value ≥ 240 pointing to table 256 − value. A length of 0
// (garbage past the last code) is taken as 1 so the walk always advances.
fn decode_at(pos: u32) -> vec2<u32> {
    let w = bits32(pos);
    var s = lut_byte(0u, w >> 24u);
    for (var shift = 16i; shift >= 0 && s >= 240u; shift -= 8) {
        let table = 256u - s;
        if (table >= p.n_luts - 1u) { return vec2<u32>(0u, 1u); }
        s = lut_byte(table, (w >> u32(shift)) & 0xffu);
    }
    if (s >= 240u) { return vec2<u32>(0u, 1u); }
    return vec2<u32>(s, max(lut_byte(p.n_luts - 1u, s), 1u));
}

fn gap_of(segment: u32) -> u32 {
    let bit = 5u * segment - 8u * p.gaps_shift;
    let j = bit >> 3u;
    let pair = (byte_of(gaps[j >> 2u], j) << 8u) | byte_of(gaps[(j + 1u) >> 2u], j + 1u);
    return (pair >> (11u - (bit & 7u))) & 31u;
}

// Codes whose first bit lies in segment `g` (global), none past the stream.
fn count_codes(g: u32) -> u32 {
    if (8u * g >= p.n_bytes) { return 0u; }
    let end = 64u * (g + 1u);
    var pos = 64u * g + gap_of(g);
    var n = 0u;
    while (pos < end) {
        pos += decode_at(pos).y;
        n += 1u;
    }
    return n;
}

fn sign_mantissa_of(i: u32) -> u32 {
    let k = i - p.sign_shift;
    return byte_of(sign_mantissa[k >> 2u], k);
}

// bf16 word `w` of element i (global, below n_elements) into the slot: a
// whole u32 when this invocation also wrote element i − 1, else an OR into
// the half it owns (`df11_clear` zeroes the slot first).
fn out_word(i: u32) -> u32 {
    return ((p.out_base + i) >> 1u) - (p.out_shift >> 1u);
}

fn write_pair(i: u32, low: u32, high: u32) {
    atomicStore(&out[out_word(i)], low | (high << 16u));
}

fn write_half(i: u32, w: u32) {
    atomicOr(&out[out_word(i)], w << (16u * (i & 1u)));
}

// Writes the codes of segment g, elements first..last-1 (clamped to `limit`).
fn write_codes(g: u32, first: u32, limit: u32) {
    if (8u * g >= p.n_bytes) { return; }
    let end = 64u * (g + 1u);
    var pos = 64u * g + gap_of(g);
    var i = first;
    var pending = 0u;
    var has_pending = false;
    while (pos < end && i < limit) {
        let d = decode_at(pos);
        let sm = sign_mantissa_of(i);
        let w = ((sm & 0x80u) << 8u) | (d.x << 7u) | (sm & 0x7fu);
        if ((i & 1u) == 0u) {
            pending = w;
            has_pending = true;
        } else if (has_pending) {
            write_pair(i, pending, w);
            has_pending = false;
        } else {
            write_half(i, w);
        }
        pos += d.y;
        i += 1u;
    }
    if (has_pending) {
        write_half(i - 1u, pending);
    }
}

@compute @workgroup_size(256)
fn df11_decode(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = lid.x;
    let block = p.block0 + wid.x + wid.y * nwg.x;
    let lut_words = min((p.n_luts * 256u) / 4u, LUT_WORDS);
    for (var i = t; i < lut_words; i += THREADS) {
        lut[i] = luts[i];
    }
    workgroupBarrier();
    let n_blocks = (p.n_bytes + BLOCK_BYTES - 1u) / BLOCK_BYTES;
    // Uniform across the workgroup: a whole workgroup past the end returns together.
    if (block >= n_blocks) { return; }
    let g0 = block * (BLOCK_BYTES / 8u) + 2u * t;
    let c0 = count_codes(g0);
    let c1 = count_codes(g0 + 1u);
    scan[t] = c0 + c1;
    workgroupBarrier();
    // Inclusive Hillis–Steele scan of the pair counts.
    for (var step = 1u; step < THREADS; step <<= 1u) {
        var add = 0u;
        if (t >= step) { add = scan[t - step]; }
        workgroupBarrier();
        scan[t] += add;
        workgroupBarrier();
    }
    let base = positions[block - p.positions_shift];
    let limit = min(positions[block + 1u - p.positions_shift], p.n_elements);
    let first = base + scan[t] - (c0 + c1);
    write_codes(g0, first, limit);
    write_codes(g0 + 1u, first + c0, limit);
}

// Zeroes the slot words holding elements [clear_first, clear_end) of the
// group, so the halves written with atomicOr land on zeros.
@compute @workgroup_size(256)
fn df11_clear(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = gid.x + gid.y * nwg.x * THREADS;
    let w0 = out_word(p.clear_first);
    let w1 = out_word(p.clear_end - 1u) + 1u;
    if (w0 + k < w1) {
        atomicStore(&out[w0 + k], 0u);
    }
}

// The VAE decoder's two ends: packed latents to the decoder's input
// (BatchNorm de-normalisation and unpatchify in one pass), and decoded
// values to 8-bit levels; and the latent preview's levels. Levels are bytes,
// four to a word (value i in bits 8·(i mod 4) of word i/4: a little-endian
// u32, so the host reads the image's bytes as they lie), the last word's
// unused bytes zero. One invocation per output element or word.

override WEIGHT_BF16: bool = true;

struct Params {
    channels: u32, height: u32, width: u32,
    src_offset: u32, dst_offset: u32, stats_offset: u32,
    count: u32, eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read> mean: array<u32>;
@group(0) @binding(3) var<storage, read> variance: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read_write> levels: array<u32>;

// Four levels (whole numbers in [0, 255], as f32) in one word, the first in its low byte.
fn level_word(l: vec4<f32>) -> u32 {
    let b = vec4<u32>(l);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

fn mean_at(i: u32) -> f32 {
    return weight_value(mean[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

fn variance_at(i: u32) -> f32 {
    return weight_value(variance[weight_word(i, WEIGHT_BF16)], i, WEIGHT_BF16);
}

// src: tokens [height·width, 4·channels], token y·width + x; dst: [channels, 2·height, 2·width].
// Channel c·4 + py·2 + px of token (y, x) is latent pixel (2y + py, 2x + px) of channel c.
// Product and sum stay two roundings, as torch computes `x·std + mean`.
@compute @workgroup_size(64)
fn denorm_unpatchify(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    let ow = 2u * p.width;
    let plane = 4u * p.height * p.width;
    if (flat >= p.channels * plane) { return; }
    let c = flat / plane;
    let oy = (flat % plane) / ow;
    let ox = flat % ow;
    let pc = c * 4u + (oy % 2u) * 2u + ox % 2u;
    let token = (oy / 2u) * p.width + ox / 2u;
    let s = p.stats_offset + pc;
    let deviation = sqrt(variance_at(s) + p.eps);
    let scaled = src[p.src_offset + token * 4u * p.channels + pc] * deviation;
    dst[p.dst_offset + flat] = scaled + mean_at(s);
}

// levels = round(clamp(src·0.5 + 0.5, 0, 1)·255): diffusers' post-processing
// to 8-bit levels. WGSL's round sends ties to even, as numpy's does; src·0.5
// is exact, so a fused multiply-add cannot change the result. `count`
// values; one invocation a word, values past `count` level 0.
@compute @workgroup_size(64)
fn pixel_levels(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let word = gid.x + gid.y * nwg.x * 64u;
    let first = 4u * word;
    if (first >= p.count) { return; }
    var l = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (first + j < p.count) {
            let unit = clamp(src[p.src_offset + first + j] * 0.5 + 0.5, 0.0, 1.0);
            l[j] = round(unit * 255.0);
        }
    }
    levels[p.dst_offset + word] = level_word(l);
}

// A latent preview: packed latents [height·width tokens, 4·channels] to RGB
// levels at the latent's resolution (2·height × 2·width, interleaved), by a
// latent-to-RGB map read from `mean` as f32 words: `channels` rows of
// [r, g, b], then the bias. Level = floor(clamp((v + 1)/2, 0, 1)·255 + 1/2),
// as the host's preview rounds. One invocation per word of levels: its four
// values come of at most two latent pixels.
fn preview_rgb(pixel: u32) -> vec3<f32> {
    let ow = 2u * p.width;
    let oy = pixel / ow;
    let ox = pixel % ow;
    let token = (oy / 2u) * p.width + ox / 2u;
    let corner = (oy % 2u) * 2u + ox % 2u;
    let m = p.stats_offset;
    let bias = m + 3u * p.channels;
    var rgb = vec3<f32>(mean_at(bias), mean_at(bias + 1u), mean_at(bias + 2u));
    for (var c = 0u; c < p.channels; c = c + 1u) {
        let z = src[p.src_offset + token * 4u * p.channels + 4u * c + corner];
        rgb = rgb + vec3<f32>(mean_at(m + 3u * c), mean_at(m + 3u * c + 1u), mean_at(m + 3u * c + 2u)) * z;
    }
    let unit = clamp((rgb + vec3<f32>(1.0)) * 0.5, vec3<f32>(0.0), vec3<f32>(1.0));
    return floor(unit * 255.0 + vec3<f32>(0.5));
}

@compute @workgroup_size(64)
fn latent_preview(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let word = gid.x + gid.y * nwg.x * 64u;
    let count = 12u * p.height * p.width;
    let first = 4u * word;
    if (first >= count) { return; }
    let pixel = first / 3u;
    let here = preview_rgb(pixel);
    // The word's last value may be the next pixel's.
    var next = here;
    if (first + 3u < count && (first + 3u) / 3u != pixel) {
        next = preview_rgb(pixel + 1u);
    }
    var l = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let v = first + j;
        if (v < count) {
            let rgb = select(here, next, v / 3u != pixel);
            l[j] = rgb[v % 3u];
        }
    }
    levels[p.dst_offset + word] = level_word(l);
}

// Rotary position embedding, in place on a [tokens, heads, head_dim] view
// (token rows `token_stride` apart). cos/sin tables are [rows, head_dim] f32,
// built on the host in f64; token t reads table row `table_row + t`.

struct Params {
    tokens: u32, heads: u32, head_dim: u32,
    offset: u32, token_stride: u32, table_row: u32,
    _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> data: array<f32>;
@group(0) @binding(2) var<storage, read> cos_table: array<f32>;
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;

// One invocation per rotated pair: (token, head, pair).
fn pair_coords(flat: u32) -> vec3<u32> {
    let half = p.head_dim / 2u;
    return vec3<u32>(flat / (p.heads * half), (flat / half) % p.heads, flat % half);
}

// FLUX.2: pairs (x[2i], x[2i+1]) rotate by the angle stored at 2i (and 2i+1).
@compute @workgroup_size(64)
fn rope_interleaved(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    if (flat >= p.tokens * p.heads * (p.head_dim / 2u)) { return; }
    let c = pair_coords(flat);
    let base = p.offset + c.x * p.token_stride + c.y * p.head_dim + 2u * c.z;
    let tab = (p.table_row + c.x) * p.head_dim + 2u * c.z;
    let a = data[base];
    let b = data[base + 1u];
    let cs = cos_table[tab];
    let sn = sin_table[tab];
    data[base] = a * cs - b * sn;
    data[base + 1u] = b * cs + a * sn;
}

// Qwen3: pairs (x[i], x[i + d/2]); y = x·cos + rotate_half(x)·sin.
@compute @workgroup_size(64)
fn rope_half(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let flat = gid.x + gid.y * nwg.x * 64u;
    if (flat >= p.tokens * p.heads * (p.head_dim / 2u)) { return; }
    let c = pair_coords(flat);
    let half = p.head_dim / 2u;
    let base = p.offset + c.x * p.token_stride + c.y * p.head_dim + c.z;
    let tab = (p.table_row + c.x) * p.head_dim + c.z;
    let a = data[base];
    let b = data[base + half];
    data[base] = a * cos_table[tab] - b * sin_table[tab];
    data[base + half] = b * cos_table[tab + half] + a * sin_table[tab + half];
}

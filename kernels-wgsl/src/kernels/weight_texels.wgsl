// Rows of a weight matrix copied into the weight texels (`Gpu::weight_texels`,
// read by the CPU adapters' linear): texel t (row-major over TEXEL_ROW
// texels a row) takes the t-th vec4 of words of the source from
// `src_offset` on: 8 bf16 or 4 f32 weights. A CPU driver fetches a storage
// load lane by lane in a loop; a texel fetch is one unrolled gather, so the
// product's many reads of W go through the texture and this copy pays the
// storage loads once. TEXEL_ROW is prepended by the host.

struct Params {
    src_offset: u32,
    count: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var texels: texture_storage_2d<rgba32uint, write>;

@compute @workgroup_size(64)
fn weight_texels(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat_workgroup(wid, nwg) * 64u + lid.x;
    if (t >= p.count) {
        return;
    }
    textureStore(texels, vec2<u32>(t % TEXEL_ROW, t / TEXEL_ROW), src[p.src_offset + t]);
}

// attention_matrix.wgsl's widest head in its wide modules: the VAE
// mid-block's single 512-wide head (T rows of 512 f32 in workgroup memory:
// 16 KiB with 8×8 tiles, 32 KiB with 16×16).
const MAX_DIM: u32 = 512u;

// attention_matrix.wgsl's widest head: FLUX's 128 (its running output,
// T rows of MAX_DIM, in workgroup memory).
const MAX_DIM: u32 = 128u;

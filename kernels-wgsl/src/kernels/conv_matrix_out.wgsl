// What matrix_gemm.wgsl asks of a convolution's module about its outputs:
// a convolution's block columns are all its own (the pairing is the
// linear's SwiGLU), and its outputs go out one by one through the module's
// `block_value_out`, never as f16 pieces. Shared by conv_matrix.wgsl and
// conv_matrix_nhwc.wgsl.

fn pairs_columns() -> bool {
    return false;
}

fn pieces_out() -> bool {
    return false;
}

fn paired_value(gate_sum: f32, up_sum: f32) -> f32 {
    return 0.0;
}

fn block_pair_out(r: u32, c: u32, value: f32) {}

fn block_half_pair_out(r: u32, c: u32, word: u32) {}

fn out_piece() -> u32 {
    return 1u;
}

fn block_piece_scale_out(r: u32, c: u32, scale: f32) {}

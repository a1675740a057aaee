// The parameter block (PeakParams on the host) and result binding shared by
// the ceiling kernels: `bench.wgsl`'s FMA and copy peaks and
// `bench_matrix.wgsl`'s matrix-unit peak.

struct Params {
    iterations: u32,
    count: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> sink: array<f32>;

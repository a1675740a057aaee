//! Real adapters' buffer and binding limits: every arena fits the largest
//! buffer, or the plan takes chunks or refuses up front.

use super::*;

/// Limits as wgpu reports them on real adapters: NVIDIA's Vulkan driver
/// (4 GiB buffers, bindings capped at 2³¹−1), Mesa's AMD and Intel drivers
/// (2 GiB), Metal with its binding clamped to 2³¹−1, WebGPU's defaults.
const REAL_LIMITS: [(&str, DeviceLimits); 4] = [
    ("NVIDIA Vulkan", DeviceLimits { max_buffer: 4 * GIB, max_binding: 2 * GIB - 1, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE }),
    ("Mesa AMD/Intel", DeviceLimits { max_buffer: 2 * GIB, max_binding: 2 * GIB - 1, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE }),
    ("Metal", DeviceLimits { max_buffer: 16 * GIB, max_binding: 2 * GIB - 1, half_operands: false, attention_products: crate::ir::AttentionProducts::NONE }),
    ("WebGPU defaults", DeviceLimits::WEBGPU_DEFAULT),
];

/// Every activation arena the plan lays out is one buffer: for both
/// models, sizes 512–4096 and each real limit set, a plan either keeps its
/// transformer arena within the largest buffer or refuses up front.
#[test]
fn planned_arenas_fit_the_adapters_largest_buffer() {
    for model in [Model::klein_4b(false), Model::klein_9b(false)] {
        for (name, limits) in REAL_LIMITS {
            for size in (512..=4096).step_by(256) {
                let input = PlanInput { limits, ..model.input(size, None) };
                match plan(&input) {
                    Ok(p) => {
                        assert!(p.largest_buffer() <= limits.max_buffer, "{name}, {size}²: arena {} above {}", p.largest_buffer(), limits.max_buffer);
                        assert!(p.largest_buffer() >= p.denoise.arena_bytes.max(p.decode.arena_bytes).max(p.encode.arena_bytes));
                        let binding = largest_binding(&input, &p).unwrap();
                        assert!(binding <= limits.max_binding, "{name}, {size}²: binding {binding} above {}", limits.max_binding);
                    }
                    Err(PlanError::ArenaTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
                    Err(PlanError::AttentionTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
                    Err(PlanError::VaeTooWide { .. } | PlanError::ReferenceTooLarge { .. }) => {}
                    Err(e) => panic!("{name}, {size}²: {e}"),
                }
            }
        }
    }
}

/// Where the unchunked arena is larger than the adapter's largest buffer, a
/// chunked one is taken (the 4B at 4096² on NVIDIA's 4 GiB buffers, and at
/// 6144² with keys and values in f16: 3.6 GB of stream, keys and values);
/// where every layout is, the plan refuses up front, naming the smallest
/// arena (the 4B at 8192²: 6.5 GB of them even with f16 keys and values).
#[test]
fn an_arena_above_the_largest_buffer_takes_chunks_or_is_refused_up_front() {
    let model = Model::klein_4b(false);
    let wide = plan(&model.input(2048, None)).unwrap();
    let limits = DeviceLimits { max_buffer: wide.denoise.arena_bytes - 1, ..LIMITS };
    let p = plan(&PlanInput { limits, ..model.input(2048, None) }).unwrap();
    assert!(p.denoise.arena_bytes < wide.denoise.arena_bytes && p.denoise.chunk.is_some(), "{:?}", p.denoise);
    let nvidia = REAL_LIMITS[0].1;
    let p = plan(&PlanInput { limits: nvidia, ..model.input(4096, None) }).unwrap();
    assert!(p.denoise.chunk.is_some() && p.denoise.arena_bytes <= nvidia.max_buffer, "{:?}", p.denoise);
    let p = plan(&PlanInput { limits: nvidia, ..model.input(6144, None) }).unwrap();
    assert!(p.denoise.half_kv && p.denoise.arena_bytes <= nvidia.max_buffer, "{:?}", p.denoise);
    match plan(&PlanInput { limits: nvidia, ..model.input(8192, None) }) {
        Err(e @ PlanError::ArenaTooLarge { bytes, limit, .. }) => {
            assert!(bytes > limit && limit == 4 * GIB);
            assert!(e.to_string().contains("above the adapter's largest buffer"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

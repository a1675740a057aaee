use super::*;
use crate::precision::Precision;

/// Every matrix pipeline a matrix-tier device has built (the flash
/// attention at start-up on f16 tiles, then a matrix linear with a bias) builds again
/// on a second device from naga's SPIR-V with wgpu's options: the driver
/// takes the modules, their overrides, the features enabled and the
/// descriptor layouts. Asked for statistics, a driver that reports them
/// gives each pipeline an executable with some; one that does not (Mesa's
/// lavapipe) is refused with the extension named.
#[test]
fn every_matrix_pipeline_built_here_builds_again_for_its_statistics() {
    let Some(gpu) = crate::test_devices::tier_gpu(Precision::Matrix) else { return };
    if gpu.info.backend != wgpu::Backend::Vulkan {
        assert_eq!(gpu.matrix_pipeline_statistics().unwrap_err(), StatisticsError::NotVulkan);
        return;
    }
    let (m, n, k) = (40u64, 24u64, 64u64);
    let x = gpu.upload_f32("x", &vec![0.5; (m * k) as usize]);
    let (w, b) = (gpu.upload_bf16("w", &vec![0x3f80; (n * k) as usize]), gpu.upload_bf16("b", &vec![0; n as usize]));
    let y = gpu.storage("y", 4 * m * n);
    let gemm = crate::kernels::Gemm { m, n, k };
    gpu.submit(|enc| crate::kernels::linear(&gpu, enc, crate::Mat::new(&x, k), crate::Weight::bf16(&w), Some(crate::Weight::bf16(&b)), crate::Mat::new(&y, n), gemm)).unwrap();
    let matrix: Vec<PipelineKey> = gpu.created_pipelines().into_iter().filter(|k| k.module.is_matrix()).collect();
    // The flash attention runs on f16 tiles only.
    assert_eq!(matrix.iter().any(|k| k.module.is_flash()), crate::test_devices::has_f16_tiles(&gpu), "the start-up check builds the flash attention on f16 tiles: {matrix:?}");
    assert!(matrix.iter().any(|k| !k.module.is_flash()), "and a matrix linear: {matrix:?}");
    let built = gpu.rebuild_pipelines(&matrix, false).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(built.len(), matrix.len());
    for p in &built {
        println!("built again: {}", pipeline_name(&p.pipeline));
    }
    match gpu.matrix_pipeline_statistics() {
        Ok(statistics) => {
            assert_eq!(statistics.len(), matrix.len());
            for p in &statistics {
                assert!(p.executables.iter().any(|e| !e.statistics.is_empty()), "{}: no statistics", pipeline_name(&p.pipeline));
            }
        }
        Err(StatisticsError::Unsupported(what)) => {
            assert_eq!(what, "VK_KHR_pipeline_executable_properties");
            println!("statistics: refused, the driver lacks {what}");
        }
        Err(e) => panic!("{e}"),
    }
}

/// A module's buffers become set layouts set by set, gaps left empty, each
/// binding of the kind its address space says.
#[test]
fn a_modules_buffers_lay_out_its_descriptor_sets() {
    let source = "
        @group(0) @binding(0) var<uniform> p: vec4<u32>;
        @group(0) @binding(3) var<storage, read> x: array<f32>;
        @group(2) @binding(1) var<storage, read_write> y: array<f32>;
        @compute @workgroup_size(1) fn main() { y[0] = x[p.x]; }
    ";
    let module = naga::front::wgsl::parse_str(source).unwrap();
    let sets = descriptor_sets(&module);
    let kinds: Vec<Vec<(u32, vk::DescriptorType)>> = sets.iter().map(|s| s.iter().map(|b| (b.binding, b.descriptor_type)).collect()).collect();
    assert_eq!(
        kinds,
        vec![vec![(0, vk::DescriptorType::UNIFORM_BUFFER), (3, vk::DescriptorType::STORAGE_BUFFER)], vec![], vec![(1, vk::DescriptorType::STORAGE_BUFFER)]]
    );
}

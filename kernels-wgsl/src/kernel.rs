//! What a kernel is to its launcher: the WGSL module it lives in, its entry
//! point with workgroup size, storage bindings and parameter block size,
//! and the grid a dispatch of many workgroups takes.

/// A WGSL source file (with the shared helpers prepended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    Linear,
    /// The range rule's row scales, measured before a matrix-tier product.
    RangeScales,
    Norm,
    /// The matrix tier's LayerNorm + modulation writing f16 products' inputs.
    NormHalf,
    Rope,
    Attention,
    /// Attention over keys and values stored as f16 pairs with a range
    /// scale per head row (the transformer's half-K/V layout).
    AttentionHalfKv,
    /// f32 rows into that layout.
    HalfPack,
    /// What lies between the products of the matrix tier's chunked
    /// attention: its softmax, its values' transposed pack, its normalisation.
    AttentionChunks,
    /// A SwiGLU written as the next product's f16 rows in pieces.
    SwigluHalf,
    /// CPU adapters' attention with each key and value row read by a
    /// subgroup of `lanes` together and broadcast, over f32 keys and values
    /// or (`half_kv`) the half-K/V layout: `attention_lanes.rs` writes its
    /// loops out for heads of `head_vec4` vec4s.
    AttentionLanes { lanes: u8, half_kv: bool, head_vec4: u8 },
    /// CPU adapters' linear with each row of x read by a subgroup of
    /// `lanes` together and broadcast (`linear_lanes.rs` writes it out).
    LinearLanes { lanes: u8 },
    /// CPU adapters' conv2d (`kernel`×`kernel`, stride 1, same size) with
    /// each input patch read by a subgroup of `lanes` together and
    /// broadcast (`conv_lanes.rs` writes it out).
    ConvLanes { lanes: u8, kernel: u8, thin: bool, long: bool },
    Elementwise,
    Conv,
    /// conv2d on 64×256 tiles (at most 64 output channels).
    ConvWide,
    Vae,
    Df11,
    /// GGML's quantized blocks expanded into f32 (GGUF weights).
    Ggml,
    Bench,
    /// The f16 tier's linear (f16-staged tiles, f32 sums).
    LinearHalf,
    /// The f16 tier's conv2d.
    ConvHalf,
    /// The f16 tier's conv2d on 64×256 tiles (at most 64 output channels).
    ConvHalfWide,
    /// The matrix tier's linear with 8×8 cooperative-matrix tiles.
    LinearMatrix8,
    /// The matrix tier's linear with 16×16 cooperative-matrix tiles.
    LinearMatrix16,
    /// The matrix tier's conv2d with 8×8 cooperative-matrix tiles.
    ConvMatrix8,
    /// The matrix tier's conv2d with 16×16 cooperative-matrix tiles.
    ConvMatrix16,
    /// The matrix tier's attention with 8×8 cooperative-matrix tiles.
    AttentionMatrix8,
    /// The matrix tier's attention with 16×16 cooperative-matrix tiles.
    AttentionMatrix16,
    /// The same for heads up to 512 wide (the VAE's mid-block), f16 tiles.
    AttentionMatrixWide8,
    AttentionMatrixWide16,
    /// The matrix tier's flash attention (opt-in), 8×8 and 16×16 f16 tiles.
    AttentionFlash8,
    AttentionFlash16,
    /// The matrix tier's linear, conv2d and attention, and the ceiling, with
    /// 8×8 f32 operand tiles (Apple GPUs' simdgroup matrices offer them).
    LinearMatrix8F32,
    ConvMatrix8F32,
    AttentionMatrix8F32,
    BenchMatrix8F32,
    /// The matrix units' ceiling (`bench`) with 8×8 tiles.
    BenchMatrix8,
    /// The matrix units' ceiling (`bench`) with 16×16 tiles.
    BenchMatrix16,
    /// The matrix tier's linear reading x and bf16 W as vec4s
    /// (`linear_matrix_vec4.wgsl`), 8×8 and 16×16 f16 tiles and 8×8 f32 ones.
    LinearMatrix8Vec4,
    LinearMatrix16Vec4,
    LinearMatrix8F32Vec4,
    /// The matrix tier's conv2d in blocks of 8T pixels × 4T output channels
    /// (2 × 1 subgroups): for convolutions whose output channels would leave
    /// half of a square block idle (a 64-channel one with 16×16 tiles).
    ConvMatrix8Narrow,
    ConvMatrix16Narrow,
    ConvMatrix8F32Narrow,
    /// The matrix tier's convolution over channels-last f16 activations.
    ConvMatrixNhwc8,
    ConvMatrixNhwc16,
    /// The same fetching four taps at a time (`conv_nhwc_vec4.wgsl`).
    ConvMatrixNhwc8Vec4,
    ConvMatrixNhwc16Vec4,
    /// Both in narrow blocks (8T pixels × 4T output channels), as the
    /// channel-major conv2d's (a tiny decoder's 64 channels on 16×16 tiles).
    ConvMatrixNhwc8Narrow,
    ConvMatrixNhwc16Narrow,
    ConvMatrixNhwc8Vec4Narrow,
    ConvMatrixNhwc16Vec4Narrow,
    ConvMatrixNhwc8Thin,
    ConvMatrixNhwc16Thin,
    ConvMatrixNhwc8Vec4Thin,
    ConvMatrixNhwc16Vec4Thin,
}

impl Module {
    pub const ALL: [Module; 71] = [
        Module::Linear,
        Module::RangeScales,
        Module::Norm,
        Module::NormHalf,
        Module::Rope,
        Module::Attention,
        Module::AttentionHalfKv,
        Module::HalfPack,
        Module::AttentionChunks,
        Module::SwigluHalf,
        Module::AttentionLanes { lanes: 4, half_kv: false, head_vec4: 32 },
        Module::AttentionLanes { lanes: 8, half_kv: false, head_vec4: 32 },
        Module::AttentionLanes { lanes: 16, half_kv: false, head_vec4: 32 },
        Module::AttentionLanes { lanes: 8, half_kv: false, head_vec4: 4 },
        Module::AttentionLanes { lanes: 8, half_kv: false, head_vec4: 128 },
        Module::AttentionLanes { lanes: 8, half_kv: true, head_vec4: 32 },
        Module::LinearLanes { lanes: 4 },
        Module::LinearLanes { lanes: 8 },
        Module::LinearLanes { lanes: 16 },
        Module::ConvLanes { lanes: 8, kernel: 3, thin: false, long: false },
        Module::ConvLanes { lanes: 8, kernel: 1, thin: false, long: false },
        Module::ConvLanes { lanes: 4, kernel: 3, thin: false, long: false },
        Module::ConvLanes { lanes: 16, kernel: 3, thin: false, long: false },
        Module::ConvLanes { lanes: 8, kernel: 3, thin: false, long: true },
        Module::ConvLanes { lanes: 8, kernel: 1, thin: false, long: true },
        Module::ConvLanes { lanes: 8, kernel: 3, thin: true, long: false },
        Module::ConvLanes { lanes: 8, kernel: 1, thin: true, long: false },
        Module::Elementwise,
        Module::Conv,
        Module::ConvWide,
        Module::Vae,
        Module::Df11,
        Module::Ggml,
        Module::Bench,
        Module::LinearHalf,
        Module::ConvHalf,
        Module::ConvHalfWide,
        Module::LinearMatrix8,
        Module::LinearMatrix16,
        Module::ConvMatrix8,
        Module::ConvMatrix16,
        Module::AttentionMatrix8,
        Module::AttentionMatrix16,
        Module::AttentionMatrixWide8,
        Module::AttentionMatrixWide16,
        Module::AttentionFlash8,
        Module::AttentionFlash16,
        Module::LinearMatrix8F32,
        Module::ConvMatrix8F32,
        Module::AttentionMatrix8F32,
        Module::BenchMatrix8F32,
        Module::BenchMatrix8,
        Module::BenchMatrix16,
        Module::LinearMatrix8Vec4,
        Module::LinearMatrix16Vec4,
        Module::LinearMatrix8F32Vec4,
        Module::ConvMatrix8Narrow,
        Module::ConvMatrix16Narrow,
        Module::ConvMatrix8F32Narrow,
        Module::ConvMatrixNhwc8,
        Module::ConvMatrixNhwc16,
        Module::ConvMatrixNhwc8Vec4,
        Module::ConvMatrixNhwc16Vec4,
        Module::ConvMatrixNhwc8Narrow,
        Module::ConvMatrixNhwc16Narrow,
        Module::ConvMatrixNhwc8Vec4Narrow,
        Module::ConvMatrixNhwc16Vec4Narrow,
        Module::ConvMatrixNhwc8Thin,
        Module::ConvMatrixNhwc16Thin,
        Module::ConvMatrixNhwc8Vec4Thin,
        Module::ConvMatrixNhwc16Vec4Thin,
    ];

    /// The file a kernel folder holds this module's source in: what
    /// `FLUX_LITE_KERNEL_DIR` looks for and `gpu --kernel-sources` writes.
    pub fn file_name(self) -> String {
        format!("{self:?}.wgsl")
    }

    pub fn name(self) -> &'static str {
        match self {
            Module::Linear => "linear",
            Module::RangeScales => "range_scales",
            Module::Norm => "norm",
            Module::NormHalf => "norm (f16 output)",
            Module::Rope => "rope",
            Module::Attention => "attention",
            Module::AttentionHalfKv => "attention (f16 keys and values)",
            Module::HalfPack => "half_pack",
            Module::AttentionChunks => "attention_chunks",
            Module::SwigluHalf => "half_pack (SwiGLU, f16)",
            Module::AttentionLanes { half_kv: false, .. } => "attention_lanes",
            Module::AttentionLanes { half_kv: true, .. } => "attention_lanes (f16 keys and values)",
            Module::LinearLanes { .. } => "linear_lanes",
            Module::ConvLanes { .. } => "conv_lanes",
            Module::Elementwise => "elementwise",
            Module::Conv => "conv",
            Module::ConvWide => "conv (64×256 tiles)",
            Module::Vae => "vae",
            Module::Df11 => "df11",
            Module::Ggml => "ggml",
            Module::Bench => "bench",
            Module::LinearHalf => "linear (f16 tier)",
            Module::ConvHalf => "conv (f16 tier)",
            Module::ConvHalfWide => "conv (f16 tier, 64×256 tiles)",
            Module::LinearMatrix8 => "linear_matrix (8×8 tiles)",
            Module::LinearMatrix16 => "linear_matrix (16×16 tiles)",
            Module::ConvMatrix8 => "conv_matrix (8×8 tiles)",
            Module::ConvMatrix16 => "conv_matrix (16×16 tiles)",
            Module::AttentionMatrix8 => "attention_matrix (8×8 tiles)",
            Module::AttentionMatrix16 => "attention_matrix (16×16 tiles)",
            Module::AttentionMatrixWide8 => "attention_matrix (8×8 tiles, heads up to 512)",
            Module::AttentionMatrixWide16 => "attention_matrix (16×16 tiles, heads up to 512)",
            Module::AttentionFlash8 => "attention_flash (8×8 tiles)",
            Module::AttentionFlash16 => "attention_flash (16×16 tiles)",
            Module::LinearMatrix8F32 => "linear_matrix (8×8 f32 tiles)",
            Module::LinearMatrix8Vec4 => "linear_matrix (8×8 tiles, vec4 loads)",
            Module::LinearMatrix16Vec4 => "linear_matrix (16×16 tiles, vec4 loads)",
            Module::LinearMatrix8F32Vec4 => "linear_matrix (8×8 f32 tiles, vec4 loads)",
            Module::ConvMatrix8F32 => "conv_matrix (8×8 f32 tiles)",
            Module::ConvMatrix8Narrow => "conv_matrix (8×8 tiles, narrow blocks)",
            Module::ConvMatrix16Narrow => "conv_matrix (16×16 tiles, narrow blocks)",
            Module::ConvMatrix8F32Narrow => "conv_matrix (8×8 f32 tiles, narrow blocks)",
            Module::ConvMatrixNhwc8 => "conv_matrix_nhwc (8×8 tiles)",
            Module::ConvMatrixNhwc16 => "conv_matrix_nhwc (16×16 tiles)",
            Module::ConvMatrixNhwc8Vec4 => "conv_matrix_nhwc (8×8 tiles, vec4 loads)",
            Module::ConvMatrixNhwc16Vec4 => "conv_matrix_nhwc (16×16 tiles, vec4 loads)",
            Module::ConvMatrixNhwc8Narrow => "conv_matrix_nhwc (8×8 tiles, narrow blocks)",
            Module::ConvMatrixNhwc16Narrow => "conv_matrix_nhwc (16×16 tiles, narrow blocks)",
            Module::ConvMatrixNhwc8Vec4Narrow => "conv_matrix_nhwc (8×8 tiles, vec4 loads, narrow blocks)",
            Module::ConvMatrixNhwc16Vec4Narrow => "conv_matrix_nhwc (16×16 tiles, vec4 loads, narrow blocks)",
            Module::ConvMatrixNhwc8Thin => "conv_matrix_nhwc (8×8 tiles, thin blocks)",
            Module::ConvMatrixNhwc16Thin => "conv_matrix_nhwc (16×16 tiles, thin blocks)",
            Module::ConvMatrixNhwc8Vec4Thin => "conv_matrix_nhwc (8×8 tiles, vec4 loads, thin blocks)",
            Module::ConvMatrixNhwc16Vec4Thin => "conv_matrix_nhwc (16×16 tiles, vec4 loads, thin blocks)",
            Module::AttentionMatrix8F32 => "attention_matrix (8×8 f32 tiles)",
            Module::BenchMatrix8F32 => "bench_matrix (8×8 f32 tiles)",
            Module::BenchMatrix8 => "bench_matrix (8×8 tiles)",
            Module::BenchMatrix16 => "bench_matrix (16×16 tiles)",
        }
    }

    /// The device features the module needs: f16 for the half tiers, and
    /// cooperative matrices for the matrix tier.
    pub fn features(self) -> wgpu::Features {
        let features = match self {
            Module::LinearHalf | Module::ConvHalf | Module::ConvHalfWide | Module::NormHalf | Module::SwigluHalf => wgpu::Features::SHADER_F16,
            Module::LinearMatrix8F32 | Module::LinearMatrix8F32Vec4 | Module::ConvMatrix8F32 | Module::ConvMatrix8F32Narrow | Module::AttentionMatrix8F32 | Module::BenchMatrix8F32 => {
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            }
            m if m.is_matrix() => wgpu::Features::SHADER_F16 | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            _ => wgpu::Features::empty(),
        };
        // The matrix linear's, conv's and flash attention's subgroups each find
        // their share by subgroup id; the CPU kernels broadcast across lanes.
        let subgroups = self.on_matrix_gemm()
            || self.is_flash()
            || matches!(self, Module::AttentionLanes { .. } | Module::LinearLanes { .. } | Module::ConvLanes { .. });
        if subgroups {
            features | wgpu::Features::SUBGROUP
        } else {
            features
        }
    }

    /// What naga must allow the module (its [`Self::features`] as naga's
    /// capabilities), to validate it as wgpu does.
    pub fn naga_capabilities(self) -> naga::valid::Capabilities {
        use naga::valid::Capabilities as C;
        let features = self.features();
        let mut caps = C::empty();
        caps.set(C::SHADER_FLOAT16, features.contains(wgpu::Features::SHADER_F16));
        caps.set(C::COOPERATIVE_MATRIX, features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX));
        caps.set(C::SUBGROUP, features.contains(wgpu::Features::SUBGROUP));
        // pack2x16float/unpack2x16float (the half-K/V layout): a downlevel
        // capability that Vulkan, Metal and DX12 always have.
        caps.set(C::SHADER_FLOAT16_IN_FLOAT32, true);
        caps
    }

    /// Whether every storage access of the module stays inside its binding
    /// by the module's own arithmetic, so that it is created without wgpu's
    /// run-time bounds checks, which make each access a branch, so that the
    /// global loads of a k step are waited for one by one (what they cost on
    /// an H200: docs/performance.md). The matrix linear's loads go through
    /// `a_at`/`b_pair` (or, reading vec4s, `a_vec4`/`b_vec8`), which select
    /// an in-binding index; `b_at`, the
    /// scales and the stores are guarded by the matrix's bounds, which the
    /// launcher's windows cover (the kernel tests run it on windows, splits
    /// and ragged edges). The flash attention's loads go through
    /// `q_load`/`k_load`/`v_load` (clamped and selected), its mask through
    /// `visible` (a clamped key), its stores inside q_len and head_dim. The
    /// matrix conv2d's (`conv_matrix.wgsl`, on the same core as the linear)
    /// gather x through `a_at` (a selected index), read W and the scales
    /// inside the output channels and pixels its call covers, and store
    /// inside them.
    pub fn indices_clamped_in_shader(self) -> bool {
        self.on_matrix_gemm() || self.is_flash()
    }

    /// The modules on `matrix_gemm.wgsl`: the matrix linear (element and
    /// vec4 fetching) and the matrix conv2d.
    fn on_matrix_gemm(self) -> bool {
        matches!(
            self,
            Module::LinearMatrix8
                | Module::LinearMatrix16
                | Module::LinearMatrix8F32
                | Module::LinearMatrix8Vec4
                | Module::LinearMatrix16Vec4
                | Module::LinearMatrix8F32Vec4
                | Module::ConvMatrix8
                | Module::ConvMatrix16
                | Module::ConvMatrix8F32
                | Module::ConvMatrix8Narrow
                | Module::ConvMatrix16Narrow
                | Module::ConvMatrix8F32Narrow
                | Module::ConvMatrixNhwc8
                | Module::ConvMatrixNhwc16
                | Module::ConvMatrixNhwc8Vec4
                | Module::ConvMatrixNhwc16Vec4
                | Module::ConvMatrixNhwc8Narrow
                | Module::ConvMatrixNhwc16Narrow
                | Module::ConvMatrixNhwc8Vec4Narrow
                | Module::ConvMatrixNhwc16Vec4Narrow
                | Module::ConvMatrixNhwc8Thin
                | Module::ConvMatrixNhwc16Thin
                | Module::ConvMatrixNhwc8Vec4Thin
                | Module::ConvMatrixNhwc16Vec4Thin
        )
    }

    /// The GEMM core's modules in blocks narrower than square (8T × 4T or
    /// 8T × T, on two subgroups).
    pub fn has_narrow_blocks(self) -> bool {
        matches!(
            self,
            Module::ConvMatrix8Narrow
                | Module::ConvMatrix16Narrow
                | Module::ConvMatrix8F32Narrow
                | Module::ConvMatrixNhwc8Narrow
                | Module::ConvMatrixNhwc16Narrow
                | Module::ConvMatrixNhwc8Vec4Narrow
                | Module::ConvMatrixNhwc16Vec4Narrow
                | Module::ConvMatrixNhwc8Thin
                | Module::ConvMatrixNhwc16Thin
                | Module::ConvMatrixNhwc8Vec4Thin
                | Module::ConvMatrixNhwc16Vec4Thin
        )
    }

    /// The matrix tier's flash attention.
    pub(crate) fn is_flash(self) -> bool {
        matches!(self, Module::AttentionFlash8 | Module::AttentionFlash16)
    }

    /// Whether the module reads x and W as vec4s at bindings 6 and 7 (the
    /// matrix linear's vec4 fetching) instead of at 1 and 2.
    pub fn reads_vec4s(self) -> bool {
        matches!(self, Module::LinearMatrix8Vec4 | Module::LinearMatrix16Vec4 | Module::LinearMatrix8F32Vec4)
    }

    /// Whether the module runs on cooperative-matrix units.
    pub fn is_matrix(self) -> bool {
        self.on_matrix_gemm()
            || self.is_flash()
            || matches!(
                self,
                Module::AttentionMatrix8
                    | Module::AttentionMatrix16
                    | Module::AttentionMatrixWide8
                    | Module::AttentionMatrixWide16
                    | Module::AttentionMatrix8F32
                    | Module::BenchMatrix8
                    | Module::BenchMatrix16
                    | Module::BenchMatrix8F32
            )
    }

    pub fn source(self) -> std::borrow::Cow<'static, str> {
        macro_rules! with_common {
            ($($file:literal),+) => {
                concat!(include_str!("kernels/common.wgsl"), $("\n", include_str!(concat!("kernels/", $file))),+)
            };
        }
        // The GEMM tiling's two tiers (gemm_tiles.wgsl): the f32 tier, and
        // the f16 tier that stages its tiles as f16 under the range rule.
        macro_rules! gemm_tier {
            (f32) => {
                "const HALF: bool = false;\nalias Stage = f32;\n"
            };
            (f16) => {
                "enable f16;\nconst HALF: bool = true;\nalias Stage = f16;\n"
            };
        }
        // Its tile shape: 128×128, or 64×256 for few rows.
        macro_rules! gemm_shape {
            (square) => {
                "const TM: u32 = 128u;\nconst TN: u32 = 128u;\n"
            };
            (wide) => {
                "const TM: u32 = 64u;\nconst TN: u32 = 256u;\n"
            };
        }
        macro_rules! with_gemm {
            ($tier:ident, $($file:literal),+) => {
                with_gemm!($tier, square, $($file),+)
            };
            ($tier:ident, $shape:ident, $($file:literal),+) => {
                concat!(
                    gemm_tier!($tier),
                    gemm_shape!($shape),
                    include_str!("kernels/common.wgsl"),
                    "\n",
                    include_str!("kernels/range_rule.wgsl"),
                    "\n",
                    include_str!("kernels/gemm_tiles.wgsl"),
                    $("\n", include_str!(concat!("kernels/", $file))),+
                )
            };
        }
        // The matrix tier's modules: the extensions first (WGSL wants them
        // before any declaration), then the tile size, the operand type
        // (f16 under the range rule, or f32) and the matrix types.
        macro_rules! operands {
            (f16) => {
                "enable f16;\nenable wgpu_cooperative_matrix;\nalias Operand = f16;\nconst OPERAND_HALF: bool = true;\n"
            };
            (f32) => {
                "enable wgpu_cooperative_matrix;\nalias Operand = f32;\nconst OPERAND_HALF: bool = false;\n"
            };
        }
        // matrix_gemm.wgsl's subgroups a workgroup, rows × columns of them,
        // and each one's tile columns: square blocks (8T × 8T), narrow ones
        // (8T pixels × 4T channels), or thin ones (8T pixels × T channels).
        macro_rules! block {
            (square) => {
                "const SG_ROWS: u32 = 2u;\nconst SG_COLS: u32 = 2u;\nconst RC: u32 = 4u;\n"
            };
            (narrow) => {
                "const SG_ROWS: u32 = 2u;\nconst SG_COLS: u32 = 1u;\nconst RC: u32 = 4u;\n"
            };
            (thin) => {
                "const SG_ROWS: u32 = 2u;\nconst SG_COLS: u32 = 1u;\nconst RC: u32 = 1u;\n"
            };
        }
        macro_rules! with_matrix {
            ($t:literal, $operand:ident, $($file:literal),+) => {
                with_matrix!($t, $operand, square, $($file),+)
            };
            ($t:literal, $operand:ident, $block:ident, $($file:literal),+) => {
                concat!(
                    operands!($operand),
                    "const T: u32 = ", $t, "u;\n",
                    block!($block),
                    "alias MatA = coop_mat", $t, "x", $t, "<", stringify!($operand), ", A>;\n",
                    "alias MatB = coop_mat", $t, "x", $t, "<", stringify!($operand), ", B>;\n",
                    "alias MatC = coop_mat", $t, "x", $t, "<f32, C>;\n",
                    include_str!("kernels/common.wgsl"),
                    "\n",
                    include_str!("kernels/range_rule.wgsl"),
                    "\n",
                    include_str!("kernels/matrix_operand.wgsl"),
                    $("\n", include_str!(concat!("kernels/", $file))),+
                )
            };
        }
        let fixed = match self {
            Module::AttentionLanes { lanes, half_kv, head_vec4 } => {
                let shared = if half_kv {
                    with_common!("attention_io.wgsl", "attention_kv_half.wgsl", "attention_cpu.wgsl")
                } else {
                    with_common!("attention_io.wgsl", "attention_kv_f32.wgsl", "attention_cpu.wgsl")
                };
                return format!("{shared}\n{}", crate::kernels::attention_lanes::source(lanes as u32, head_vec4 as u32)).into();
            }
            Module::LinearLanes { lanes } => {
                let shared = with_common!("product_io.wgsl", "linear_io.wgsl");
                return format!("{shared}\n{}", crate::kernels::linear_lanes::source(lanes as u32)).into();
            }
            Module::ConvLanes { lanes, kernel, thin, long } => {
                use crate::kernels::conv_lanes::{shape, source};
                let shared = with_common!("product_io.wgsl", "conv_io.wgsl");
                return format!("{shared}\n{}", source(lanes as u32, kernel as u32, shape(thin, long))).into();
            }
            Module::Linear => with_gemm!(f32, "product_io.wgsl", "linear_io.wgsl", "linear.wgsl"),
            Module::LinearHalf => with_gemm!(f16, "product_io.wgsl", "linear_io.wgsl", "linear.wgsl"),
            Module::RangeScales => with_common!("range_rule.wgsl", "range_scales.wgsl"),
            Module::Norm => with_common!("norm.wgsl"),
            Module::NormHalf => concat!("enable f16;\n", with_common!("range_rule.wgsl", "norm.wgsl", "norm_half.wgsl", "group_norm_nhwc.wgsl")),
            Module::Rope => with_common!("rope.wgsl"),
            Module::Attention => with_common!("attention_io.wgsl", "attention_kv_f32.wgsl", "attention.wgsl", "attention_cpu.wgsl"),
            Module::AttentionHalfKv => with_common!("attention_io.wgsl", "attention_kv_half.wgsl", "attention.wgsl", "attention_cpu.wgsl"),
            Module::HalfPack => with_common!("range_rule.wgsl", "half_pack.wgsl"),
            Module::AttentionChunks => with_common!("range_rule.wgsl", "attention_chunks.wgsl"),
            Module::SwigluHalf => concat!("enable f16;\n", with_common!("range_rule.wgsl", "half_pack.wgsl", "swiglu_half.wgsl")),
            Module::Elementwise => with_common!("elementwise.wgsl"),
            Module::Conv => with_gemm!(f32, "product_io.wgsl", "conv_io.wgsl", "conv.wgsl"),
            Module::ConvWide => with_gemm!(f32, wide, "product_io.wgsl", "conv_io.wgsl", "conv.wgsl"),
            Module::ConvHalf => with_gemm!(f16, "product_io.wgsl", "conv_io.wgsl", "conv.wgsl"),
            Module::ConvHalfWide => with_gemm!(f16, wide, "product_io.wgsl", "conv_io.wgsl", "conv.wgsl"),
            Module::Vae => with_common!("vae.wgsl"),
            Module::Df11 => with_common!("df11.wgsl"),
            Module::Ggml => with_common!("range_rule.wgsl", "ggml.wgsl", "ggml_half.wgsl"),
            Module::Bench => with_common!("bench_io.wgsl", "bench.wgsl"),
            Module::LinearMatrix8 => with_matrix!("8", f16, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::LinearMatrix16 => with_matrix!("16", f16, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrix8 => with_matrix!("8", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrix16 => with_matrix!("16", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::AttentionMatrix8 => with_matrix!("8", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_head_128.wgsl", "attention_matrix.wgsl"),
            Module::AttentionMatrix16 => with_matrix!("16", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_head_128.wgsl", "attention_matrix.wgsl"),
            Module::AttentionMatrixWide8 => with_matrix!("8", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_head_512.wgsl", "attention_matrix.wgsl"),
            Module::AttentionMatrixWide16 => with_matrix!("16", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_head_512.wgsl", "attention_matrix.wgsl"),
            Module::AttentionFlash8 => with_matrix!("8", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_qkv_quads.wgsl", "attention_flash.wgsl"),
            Module::AttentionFlash16 => with_matrix!("16", f16, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_qkv_quads.wgsl", "attention_flash.wgsl"),
            Module::BenchMatrix8 => with_matrix!("8", f16, "bench_io.wgsl", "bench_matrix.wgsl"),
            Module::LinearMatrix8F32 => with_matrix!("8", f32, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_scalar.wgsl", "matrix_fetch.wgsl"),
            Module::LinearMatrix8Vec4 => with_matrix!("8", f16, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "linear_matrix_vec4.wgsl", "matrix_fetch_vec4.wgsl", "linear_half_quads.wgsl", "half_octets.wgsl"),
            Module::LinearMatrix16Vec4 => with_matrix!("16", f16, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "linear_matrix_vec4.wgsl", "matrix_fetch_vec4.wgsl", "linear_half_quads.wgsl", "half_octets.wgsl"),
            Module::LinearMatrix8F32Vec4 => with_matrix!("8", f32, "product_io.wgsl", "linear_io.wgsl", "linear_matrix.wgsl", "linear_head_norm.wgsl", "matrix_gemm.wgsl", "matrix_tiles_scalar.wgsl", "linear_matrix_vec4.wgsl", "matrix_fetch_vec4.wgsl", "linear_half_quads_widened.wgsl"),
            Module::ConvMatrix8F32 => with_matrix!("8", f32, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_scalar.wgsl", "matrix_fetch.wgsl"),
            Module::AttentionMatrix8F32 => with_matrix!("8", f32, "attention_io.wgsl", "attention_kv_f32.wgsl", "attention_qkv.wgsl", "attention_head_128.wgsl", "attention_matrix.wgsl"),
            Module::BenchMatrix8F32 => with_matrix!("8", f32, "bench_io.wgsl", "bench_matrix.wgsl"),
            Module::BenchMatrix16 => with_matrix!("16", f16, "bench_io.wgsl", "bench_matrix.wgsl"),
            Module::ConvMatrix8Narrow => with_matrix!("8", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrix16Narrow => with_matrix!("16", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrix8F32Narrow => with_matrix!("8", f32, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_scalar.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc8 => with_matrix!("8", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc16 => with_matrix!("16", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc8Vec4 => with_matrix!("8", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
            Module::ConvMatrixNhwc16Vec4 => with_matrix!("16", f16, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
            Module::ConvMatrixNhwc8Narrow => with_matrix!("8", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc16Narrow => with_matrix!("16", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc8Vec4Narrow => with_matrix!("8", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
            Module::ConvMatrixNhwc16Vec4Narrow => with_matrix!("16", f16, narrow, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
            Module::ConvMatrixNhwc8Thin => with_matrix!("8", f16, thin, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc16Thin => with_matrix!("16", f16, thin, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "matrix_fetch.wgsl"),
            Module::ConvMatrixNhwc8Vec4Thin => with_matrix!("8", f16, thin, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
            Module::ConvMatrixNhwc16Vec4Thin => with_matrix!("16", f16, thin, "product_io.wgsl", "conv_io.wgsl", "conv_matrix_nhwc.wgsl", "conv_matrix_common.wgsl", "matrix_gemm.wgsl", "matrix_tiles_vec4.wgsl", "conv_nhwc_vec4.wgsl", "matrix_fetch_vec4.wgsl", "half_octets.wgsl"),
        };
        fixed.into()
    }
}

/// How a kernel uses a storage binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// One entry point and its interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    pub module: Module,
    pub entry: &'static str,
    pub workgroup_size: [u32; 3],
    /// Storage bindings the entry point uses, in binding order (binding 0, the params, excluded).
    pub storage: &'static [(u32, Access)],
    /// Size in bytes of the uniform `Params` block.
    pub params_size: usize,
    /// Name of the bool override that selects bf16 (true) or f32 weights, if the kernel has one.
    pub weight_dtype_override: Option<&'static str>,
}

pub(crate) const fn kernel(
    module: Module,
    entry: &'static str,
    workgroup_size: [u32; 3],
    storage: &'static [(u32, Access)],
    params_size: usize,
    weights: bool,
) -> Kernel {
    Kernel {
        module,
        entry,
        workgroup_size,
        storage,
        params_size,
        weight_dtype_override: if weights { Some("WEIGHT_BF16") } else { None },
    }
}

/// Most workgroups one grid dimension may have on every adapter.
pub const MAX_GRID_DIM: u32 = 65535;

/// A grid of at least `workgroups` workgroups, wrapped into y past
/// `MAX_GRID_DIM` (the kernels flatten it back and skip the excess).
pub fn wrapped_grid(workgroups: u64) -> [u32; 3] {
    let x = workgroups.clamp(1, MAX_GRID_DIM as u64);
    let y = workgroups.div_ceil(x).max(1);
    [x as u32, y as u32, 1]
}

//! Precision tiers: how the matrix products run on an adapter.
//!
//! - `f32`: scalar f32 FMA everywhere (the reference tier; its goldens never move).
//! - `f16`: the linear layers and the VAE's convolutions stage their tiles in
//!   workgroup memory as f16 (half the bytes and bandwidth) and sum in f32.
//! - `matrix`: the linear layers, the VAE's convolutions and attention's two
//!   products (heads up to 128 wide) on the adapter's cooperative-matrix units
//!   (Vulkan `VK_KHR_cooperative_matrix`, Metal simdgroup matrices), f16
//!   operands into an f32 accumulator, in the tile size the adapter lists.
//!
//! Both half tiers round operands to f16 under one range rule
//! (`kernels/range_rule.wgsl`): per row of each operand, a power-of-two scale
//! that keeps values inside f16's normal range. The other kernels (norms,
//! RoPE, softmax, elementwise; attention below the matrix tier) run f32.
//!
//! The tier is chosen when the device is made ([`crate::GpuOptions::precision`]);
//! [`Precision::Auto`] takes f32 on a CPU adapter (where the half tiers are
//! slower and less exact), elsewhere the best the adapter offers, proven
//! with a known-answer product first ([`crate::Gpu::new`]).

use wgpu::{CooperativeMatrixProperties, CooperativeScalarType};

/// A precision tier, or `Auto` to let the adapter decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 on a CPU adapter ([`crate::Gpu::auto_reason`] says why);
    /// elsewhere the best tier the adapter offers that passes a
    /// known-answer probe: matrix, else f16, else f32.
    Auto,
    /// Scalar f32 arithmetic; the library's default, as the reference tier.
    #[default]
    F32,
    /// f16-staged tiles, f32 sums.
    F16,
    /// Cooperative-matrix tiles, f16 operands, f32 accumulation.
    Matrix,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Matrix => "matrix",
        }
    }

    /// The tier called `name` (`auto`, `f32`, `f16`, `matrix`).
    pub fn from_name(name: &str) -> Option<Self> {
        [Precision::Auto, Precision::F32, Precision::F16, Precision::Matrix].into_iter().find(|p| p.name() == name)
    }
}

/// The cooperative-matrix configuration the matrix tier runs: square tiles
/// of `size` (the K of the product too) with `operands` A and B and an f32
/// C, one subgroup of `subgroup` invocations owning each tile; the GEMM
/// core's k steps staged as `staging` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixConfig {
    pub size: u32,
    pub subgroup: u32,
    pub operands: MatrixOperands,
    pub staging: GemmStaging,
}

/// How the GEMM core (matrix_gemm.wgsl: the linear's and the convolutions')
/// stages its k steps in workgroup memory: `step_tiles` tiles of terms a
/// step (KT = 2T or T), in `buffers` buffers (2: the next step rounded into
/// the other buffer during the products; 1: after them, behind a second
/// barrier). Deeper staging hides more of a workgroup's own load latency;
/// leaner staging lets more workgroups share a compute unit's memory, each
/// one's products covering the others' loads. Its tiles go out through
/// `out_slots` T×T slots a subgroup (2: one barrier a tile; 1: two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmStaging {
    pub step_tiles: u32,
    pub buffers: u32,
    pub out_slots: u32,
}

impl GemmStaging {
    /// Two steps of 2T terms (the core as first written).
    pub const DEEP: GemmStaging = GemmStaging { step_tiles: 2, buffers: 2, out_slots: 2 };
    /// One step of 2T terms.
    pub const SINGLE: GemmStaging = GemmStaging { step_tiles: 2, buffers: 1, out_slots: 2 };
    /// One step of T terms.
    pub const LEAN: GemmStaging = GemmStaging { step_tiles: 1, buffers: 1, out_slots: 2 };
    /// From the deepest to the leanest.
    pub const ALL: [GemmStaging; 3] = [GemmStaging::DEEP, GemmStaging::SINGLE, GemmStaging::LEAN];

    /// Its name (`deep`, `single`, `lean`), whatever its out-slots.
    pub fn name(&self) -> &'static str {
        match (self.step_tiles, self.buffers) {
            (2, 2) => "deep",
            (2, 1) => "single",
            _ => "lean",
        }
    }

    /// The staging called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        GemmStaging::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Terms a k step (KT) on tiles of `size`.
    pub fn terms(&self, size: u32) -> u32 {
        self.step_tiles * size
    }

    /// The same with one out-slot a subgroup (T·T f32 fewer a subgroup).
    pub fn one_out_slot(self) -> Self {
        GemmStaging { out_slots: 1, ..self }
    }

    /// The module's overrides for it (`KT`, `STAGES`, `OUT_SLOTS`) on tiles of `size`.
    pub fn constants(&self, size: u32) -> [(&'static str, u32); 3] {
        [("KT", self.terms(size)), ("STAGES", self.buffers), ("OUT_SLOTS", self.out_slots)]
    }

    /// In words: `2 buffers of 32 terms` (`, 1 out-slot` where it has one).
    pub fn describe(&self, size: u32) -> String {
        let buffers = if self.buffers == 1 { "1 buffer" } else { "2 buffers" };
        let slots = if self.out_slots == 1 { ", 1 out-slot" } else { "" };
        format!("{buffers} of {} terms{slots}", self.terms(size))
    }
}

/// The type of a matrix tile's A and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixOperands {
    /// f16, under the range rule.
    F16,
    /// f32 (8×8 only, as Apple GPUs offer it): no rounding, no range rule.
    F32,
}

impl MatrixConfig {
    /// Of a kernel's three matrix variants (8×8 f16, 16×16 f16, 8×8 f32), the one this configuration runs.
    pub fn pick<'k, K>(&self, [f16_8, f16_16, f32_8]: [&'k K; 3]) -> &'k K {
        match (self.operands, self.size) {
            (MatrixOperands::F32, _) => f32_8,
            (MatrixOperands::F16, 16) => f16_16,
            (MatrixOperands::F16, _) => f16_8,
        }
    }

    /// Workgroup memory of the matrix linear (matrix_gemm.wgsl, square
    /// blocks): the staging's buffers of the block's rows of A and columns
    /// of B (8T rows of KT + 8 operands each), its out-slots' T×T f32 tiles
    /// per subgroup (4; two in every staging but a forced one's fallback), the block's 8T row scales and 16T
    /// inverse scales, and its rows' largest magnitudes in up to 4 pieces
    /// (8T × 4, for f16 output in pieces). With 16×16 f16 tiles: 52,736
    /// bytes deep, 32,256 single, 24,064 lean; 8×8 f16: 16,128 deep; 8×8
    /// f32: 28,416 deep, 16,128 single; 16×16 deep with one out-slot: 48,640.
    pub fn linear_workgroup_bytes(&self) -> u32 {
        let t = self.size;
        let operand = match self.operands {
            MatrixOperands::F16 => 2,
            MatrixOperands::F32 => 4,
        };
        let staged = self.staging.buffers * 2 * (8 * t) * (self.staging.terms(t) + 8) * operand;
        staged + self.staging.out_slots * 4 * t * t * 4 + 24 * t * 4 + 8 * t * 4 * 4
    }

    /// This configuration with the deepest staging of which two linear
    /// workgroups fit in `workgroup_memory` bytes, else the leanest if one
    /// does; `None` where none fits.
    pub fn staged_for(self, workgroup_memory: u32) -> Option<MatrixConfig> {
        let with = |staging| MatrixConfig { staging, ..self };
        let two_fit = GemmStaging::ALL.into_iter().map(with).find(|c| 2 * c.linear_workgroup_bytes() <= workgroup_memory);
        two_fit.or_else(|| with(GemmStaging::LEAN).fitting(workgroup_memory).ok())
    }

    /// This configuration where one linear workgroup of it fits in
    /// `workgroup_memory` bytes, else with one out-slot where that fits, or
    /// why not.
    fn fitting(self, workgroup_memory: u32) -> Result<MatrixConfig, String> {
        let lean_out = MatrixConfig { staging: self.staging.one_out_slot(), ..self };
        if self.linear_workgroup_bytes() > workgroup_memory && lean_out.linear_workgroup_bytes() <= workgroup_memory {
            return Ok(lean_out);
        }
        let need = self.linear_workgroup_bytes();
        if need > workgroup_memory {
            return Err(format!("its linear staged in {} needs {need} bytes of workgroup memory and the adapter has {workgroup_memory}", self.staging.describe(self.size)));
        }
        Ok(self)
    }

    /// Terms a k step of the GEMM core (KT).
    fn step_terms(&self) -> u32 {
        self.staging.terms(self.size)
    }

    /// Whether the matrix linear's invocations can each hold their share of
    /// a k step in registers (matrix_gemm.wgsl's `fetch`: BM·KT = 8T·KT
    /// values over 4 subgroups, whole and at most 32 each).
    pub fn fetches_whole_steps(&self) -> bool {
        let (invocations, values) = (4 * self.subgroup, 8 * self.size * self.step_terms());
        values.is_multiple_of(invocations) && values / invocations <= 32
    }

    /// Whether each invocation's share of a matrix-linear k step is whole
    /// vec4s within `linear_matrix_vec4.wgsl`'s registers: BM·KT / 4 vec4s
    /// of x (at most 8 each) and BN·KT / 8 of W (at most 4 each) over 4
    /// subgroups.
    pub fn fetches_vec4_steps(&self) -> bool {
        self.fetches_vec4_steps_on(4, 8 * self.size as u64)
    }

    /// The same for a block of `columns` on `subgroups` subgroups (4: the
    /// square block, 8T rows × 8T columns; 2: the convolutions' narrow one,
    /// 8T × 4T, and thin one, 8T × T): BM·KT / 4 vec4s of A (at most
    /// 32 / subgroups each: 8, or 16 on two subgroups, `conv_nhwc_vec4.wgsl`'s
    /// `FETCH_A`) and columns·KT / 8 octets of W in rounds of the
    /// invocations (at most 4; a thin block's last round, or only one, may
    /// leave some invocations without one: `matrix_fetch_vec4.wgsl`'s
    /// `takes_octet`).
    pub fn fetches_vec4_steps_on(&self, subgroups: u32, columns: u64) -> bool {
        let (invocations, terms) = ((subgroups * self.subgroup) as u64, self.step_terms() as u64);
        let (x, w) = (8 * self.size as u64 * terms / 4, columns * terms / 8);
        x.is_multiple_of(invocations) && x / invocations <= 32 / subgroups as u64 && w > 0 && w.div_ceil(invocations) <= 4
    }

    /// The configuration in words: `8×8 f16 tiles into f32, subgroup 8`.
    pub fn describe(&self) -> String {
        let operands = match self.operands {
            MatrixOperands::F16 => "f16",
            MatrixOperands::F32 => "f32",
        };
        format!("{0}×{0} {operands} tiles into f32, subgroup {1}, k staged in {2}", self.size, self.subgroup, self.staging.describe(self.size))
    }
}

/// Sizes the WGSL cooperative-matrix types come in (`coop_mat8x8`, `coop_mat16x16`).
pub const MATRIX_SIZES: [u32; 2] = [8, 16];

/// The configuration to run from what the adapter lists, or why there is
/// none: 8×8 f32 × f32 → f32 where offered (exact operands), else square
/// f16 × f16 → f32 tiles of a size WGSL has (the largest offered); and one
/// fixed subgroup size (a tile's owner must be a whole workgroup); staged
/// as deep as `workgroup_memory` (bytes a workgroup may declare) holds two
/// workgroups of the linear ([`MatrixConfig::staged_for`]), or as `forced`
/// says where one workgroup of that fits.
pub fn pick_matrix_config(offered: &[CooperativeMatrixProperties], subgroup: (u32, u32), workgroup_memory: u32, forced: Option<GemmStaging>) -> Result<MatrixConfig, String> {
    let square = |p: &CooperativeMatrixProperties, size: u32, ab: CooperativeScalarType| {
        p.ab_type == ab && p.cr_type == CooperativeScalarType::F32 && p.m_size == size && p.n_size == size && p.k_size == size
    };
    let f32_8 = offered.iter().any(|p| square(p, 8, CooperativeScalarType::F32));
    let f16_size = MATRIX_SIZES.into_iter().rev().find(|&size| offered.iter().any(|p| square(p, size, CooperativeScalarType::F16)));
    let (size, operands) = match (f32_8, f16_size) {
        (true, _) => (8, MatrixOperands::F32),
        (false, Some(size)) => (size, MatrixOperands::F16),
        (false, None) if offered.is_empty() => return Err("the adapter offers no cooperative matrices".to_string()),
        (false, None) => {
            return Err(format!(
                "none of the adapter's cooperative matrices is 8×8 f32 × f32 → f32 or square f16 × f16 → f32 of size 8 or 16 ({})",
                describe(offered)
            ))
        }
    };
    let subgroup = match subgroup {
        (min, max) if min == max && min > 0 => min,
        (min, max) => return Err(format!("the adapter's subgroup size varies ({min} to {max}), so no workgroup is exactly one subgroup")),
    };
    let config = MatrixConfig { size, subgroup, operands, staging: forced.unwrap_or(GemmStaging::LEAN) };
    match forced {
        Some(_) => config.fitting(workgroup_memory),
        None => config.staged_for(workgroup_memory).map_or_else(|| config.fitting(workgroup_memory), Ok),
    }
}

/// The configurations an adapter lists, as `8×8×8 f16·f16→f32` items.
pub fn describe(offered: &[CooperativeMatrixProperties]) -> String {
    let name = |t: CooperativeScalarType| match t {
        CooperativeScalarType::F32 => "f32",
        CooperativeScalarType::F16 => "f16",
        CooperativeScalarType::I32 => "i32",
        CooperativeScalarType::U32 => "u32",
    };
    let items: Vec<String> =
        offered.iter().map(|p| format!("{}×{}×{} {}·{}→{}", p.m_size, p.n_size, p.k_size, name(p.ab_type), name(p.ab_type), name(p.cr_type))).collect();
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(size: u32, ab: CooperativeScalarType, cr: CooperativeScalarType) -> CooperativeMatrixProperties {
        CooperativeMatrixProperties { m_size: size, n_size: size, k_size: size, ab_type: ab, cr_type: cr, saturating_accumulation: false }
    }

    #[test]
    fn the_largest_square_f16_to_f32_tile_is_taken() {
        use CooperativeScalarType::{F16, F32};
        let f16 = |size, subgroup, staging| Ok(MatrixConfig { size, subgroup, operands: MatrixOperands::F16, staging });
        let offered = [offer(8, F16, F16), offer(8, F16, F32), offer(16, F16, F32), offer(32, F16, F32)];
        assert_eq!(pick_matrix_config(&offered, (32, 32), 48 << 10, None), f16(16, 32, GemmStaging::LEAN));
        assert_eq!(pick_matrix_config(&offered[..2], (8, 8), 64 << 10, None), f16(8, 8, GemmStaging::DEEP));
        assert!(pick_matrix_config(&offered[..1], (8, 8), 64 << 10, None).unwrap_err().contains("8×8×8 f16·f16→f16"));
        assert!(pick_matrix_config(&[], (8, 8), 64 << 10, None).unwrap_err().contains("no cooperative matrices"));
        assert!(pick_matrix_config(&offered, (16, 32), 64 << 10, None).unwrap_err().contains("varies"));
        assert!(pick_matrix_config(&offered, (32, 32), 16 << 10, None).unwrap_err().contains("needs 24064 bytes of workgroup memory and the adapter has 16384"));
        // A staging asked for: taken where one workgroup of it fits, refused naming the bytes where not.
        // Deep on 48 KiB: with one out-slot (48,640 bytes; two take 52,736).
        assert_eq!(pick_matrix_config(&offered, (32, 32), 48 << 10, Some(GemmStaging::DEEP)), f16(16, 32, GemmStaging::DEEP.one_out_slot()));
        assert_eq!(pick_matrix_config(&offered, (32, 32), 52 << 10, Some(GemmStaging::DEEP)), f16(16, 32, GemmStaging::DEEP));
        let refused = pick_matrix_config(&offered, (32, 32), 32 << 10, Some(GemmStaging::DEEP)).unwrap_err();
        assert_eq!(refused, "its linear staged in 2 buffers of 32 terms needs 52736 bytes of workgroup memory and the adapter has 32768");
    }

    #[test]
    fn f32_tiles_are_taken_where_offered_as_on_apple_gpus() {
        use CooperativeScalarType::{F16, F32};
        // What wgpu lists for Metal's simdgroup matrices.
        let apple = [offer(8, F32, F32), offer(8, F16, F16), offer(8, F16, F32)];
        // Apple GPUs' 32 KiB of threadgroup memory.
        let config = pick_matrix_config(&apple, (32, 32), 32 << 10, None).unwrap();
        assert_eq!(config, MatrixConfig { size: 8, subgroup: 32, operands: MatrixOperands::F32, staging: GemmStaging::SINGLE });
        assert_eq!(*config.pick([&"8 f16", &"16 f16", &"8 f32"]), "8 f32");
        assert_eq!(config.describe(), "8×8 f32 tiles into f32, subgroup 32, k staged in 1 buffer of 16 terms");
        let nvidia = [offer(16, F16, F16), offer(16, F16, F32)];
        assert_eq!(*pick_matrix_config(&nvidia, (32, 32), 48 << 10, None).unwrap().pick([&"8 f16", &"16 f16", &"8 f32"]), "16 f16");
    }

    /// The deepest staging of which two linear workgroups fit is taken:
    /// NVIDIA's Vulkan driver offers 48 KiB a workgroup, AMD's 64 KiB,
    /// Apple's and lavapipe's 32 KiB; where not even two of the
    /// leanest fit, one is enough to run.
    #[test]
    fn the_staging_is_the_deepest_of_which_two_workgroups_fit() {
        let at = |size, operands, memory: u32| MatrixConfig { size, subgroup: 32, operands, staging: GemmStaging::DEEP }.staged_for(memory).map(|c| c.staging);
        let (f16, f32) = (MatrixOperands::F16, MatrixOperands::F32);
        assert_eq!(at(16, f16, 48 << 10), Some(GemmStaging::LEAN));
        assert_eq!(at(16, f16, 64 << 10), Some(GemmStaging::SINGLE));
        assert_eq!(at(16, f16, 96 << 10), Some(GemmStaging::SINGLE));
        assert_eq!(at(16, f16, 104 << 10), Some(GemmStaging::DEEP));
        assert_eq!(at(16, f16, 24 << 10), Some(GemmStaging::LEAN));
        // One workgroup where only one fits, with one out-slot where two do not.
        assert_eq!(at(16, f16, 24_063), Some(GemmStaging::LEAN.one_out_slot()));
        assert_eq!(at(16, f16, 19_967), None);
        assert_eq!(at(8, f16, 32 << 10), Some(GemmStaging::DEEP));
        assert_eq!(at(8, f32, 32 << 10), Some(GemmStaging::SINGLE));
        assert_eq!(at(8, f32, 64 << 10), Some(GemmStaging::DEEP));
        for memory in [24 << 10, 32 << 10, 48 << 10, 64 << 10] {
            for (size, operands) in [(8, f16), (16, f16), (8, f32)] {
                let config = MatrixConfig { size, subgroup: 32, operands, staging: GemmStaging::DEEP }.staged_for(memory).unwrap();
                assert!(2 * config.linear_workgroup_bytes() <= memory || config.staging == GemmStaging::LEAN, "{memory}: {config:?}");
            }
        }
    }
}

//! A component's weights on the device, placed for its block programs as
//! the plan's [`WeightStrategy`] says:
//!
//! - resident bf16: plain tensors uploaded once, DF11 groups expanded once on the device;
//! - DF11 resident: a group that one block alone reads stays compressed and
//!   `df11_decode` expands it into a bf16 slot at the start of that block, so
//!   only one block's (or two blocks') bf16 weights exist at a time;
//! - streamed: every weight one block alone reads is copied from the
//!   memory-mapped file into a slot as that block starts, through one staging
//!   buffer; a DF11 group is copied compressed into a device area and
//!   expanded there into the slot by `df11_decode`, so no bf16 copy of it
//!   ever exists on the host.
//!
//! Weights that several blocks read stay resident under every strategy.

use crate::model::df11::{area_bytes_of, block_positions, AreaRun, Df11DeviceGroup};
use crate::error::{GpuError, LoadError, RunError};
use flux_lite_kernels::{kernels, DeviceBuffer, Gpu};
use flux_lite_kernels::{Weight, WeightDtype};
use crate::model::safetensors_store::{widen_to_f32, QuantizedRef, TensorRef, WeightStore};
use flux_lite_core::plan::{BlockWeights, WeightSizes, WeightStrategy, DF11_STREAM_AREA, SLOT_ALIGN, STREAM_STAGING};
use flux_lite_core::ggml::GgmlType;
use flux_lite_core::ir::Op;
use safetensors::tensor::Dtype;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod assignment;
mod packing;
mod staging;
mod weight;

use assignment::{block_weights, expanded_bytes, half_expansion, packed_scratch_bytes, plain_bytes, product_shapes, scaled_products, streamable, Assignment, HalfRows};
pub use assignment::product_weights;
pub use assignment::PACKED_SCRATCH;
use staging::{area_align, area_piece, Piece, Staging};
pub use weight::{DeviceWeight, StoredScales};

/// A weight copied from host memory into a slot as its block starts.
#[derive(Debug, Clone)]
struct StreamedWeight {
    name: String,
    slot: usize,
    /// Byte offset in the slot.
    offset: u64,
}

/// A group expansion recorded at the start of a block.
#[derive(Debug, Clone, Copy)]
struct SlotFill {
    group: usize,
    slot: usize,
    /// First bf16 element of the group in the slot.
    base: u64,
}

/// A DF11 group streamed compressed into the area and expanded into a slot
/// as its block starts.
#[derive(Debug)]
struct StreamedGroup {
    group: usize,
    slot: usize,
    /// First bf16 element of the group in the slot.
    base: u64,
    /// Its block positions, copied to the area with its arrays.
    positions: Vec<u32>,
    /// Zeroing its words of the slot, before the first run's decode.
    clear: Vec<flux_lite_kernels::Dispatch>,
    /// The runs of blocks it streams through the area in, each with its
    /// expansion into the slot (made once at load).
    runs: Vec<(AreaRun, Vec<flux_lite_kernels::Dispatch>)>,
}

/// A linear's weight in GGML blocks on the device: `buffer` from byte `at`
/// on, rows of `width` elements, expanded a few rows at a time into the
/// scratch as the linear runs.
#[derive(Debug, Clone)]
pub struct Packed {
    pub buffer: DeviceBuffer,
    pub at: u64,
    pub ggml: GgmlType,
    /// FP8's per-tensor scale (1 for GGML blocks).
    pub scale: f32,
    pub width: u64,
}

/// What [`DeviceWeights::for_blocks`] writes once every buffer is allocated.
#[derive(Default)]
struct Pending {
    /// Resident tensors, by name.
    tensors: Vec<String>,
    /// (index in `groups`, group) of the groups kept compressed.
    compressed: Vec<(usize, usize)>,
    /// Groups expanded once at load, and the buffer each expands into.
    expansions: Vec<(usize, DeviceBuffer)>,
    /// Tensors kept resident in GGML blocks.
    packed: Vec<String>,
    /// Tensors in GGML blocks expanded once at load, their buffers, and
    /// their f16 rows where they expand into those (else f32).
    quantized_expansions: Vec<(String, DeviceBuffer, Option<HalfRows>)>,
}

/// The zero word after a streamed group's gaps, which the last thread's two-byte read may touch.
const GAPS_PAD: [u8; 4] = [0; 4];

/// Every weight a component's programs read, on the device.
#[derive(Debug, Default)]
pub struct DeviceWeights {
    map: HashMap<String, DeviceWeight>,
    /// Groups kept compressed, expanded per block.
    groups: Vec<Df11DeviceGroup>,
    slots: Vec<DeviceBuffer>,
    /// The expansions at the start of each block.
    fills: Vec<Vec<SlotFill>>,
    /// The copies from host memory at the start of each block.
    streams: Vec<Vec<StreamedWeight>>,
    /// The DF11 groups streamed compressed at the start of each block.
    streamed_groups: Vec<Vec<StreamedGroup>>,
    /// Linears' weights held in GGML blocks (resident, or in a slot).
    packed: HashMap<String, Packed>,
    /// Where their linears expand rows of them.
    packed_scratch: Option<DeviceBuffer>,
    /// Where a streamed group's compressed arrays land (the largest group's size).
    area: Option<DeviceBuffer>,
    /// Per block: the products' weights in its slot whose range scales it
    /// measures once its slot is filled (the matrix tier).
    slot_scales: Vec<Vec<String>>,
    /// What streamed weights pass through (streaming only).
    staging: Option<Staging>,
    /// Device bytes held: plain tensors, expanded groups, compressed groups, slots.
    bytes: u64,
}

impl DeviceWeights {
    /// The weight bytes of each block of `blocks` and of what they share,
    /// as [`Self::for_blocks`] lays them out, for the planner.
    pub fn sizes(store: &WeightStore, blocks: &[Vec<Op>]) -> Result<WeightSizes, RunError> {
        let a = Assignment::new(store, blocks);
        let products = product_shapes(blocks);
        let mut sizes = WeightSizes::default();
        for held in &a.own {
            sizes.add_block(block_weights(store, held, &products)?);
        }
        let shared = block_weights(store, &a.shared, &products)?;
        sizes.shared = shared.plain + shared.grouped;
        sizes.shared_packed = shared.packed;
        sizes.shared_packed_expanded = shared.packed_expanded;
        sizes.shared_packed_expanded_half = shared.packed_expanded_half;
        sizes.packed_scratch = packed_scratch_bytes(store, &a)?;
        for name in &a.expanded {
            sizes.shared += expanded_bytes(&quantized(store, name)?);
        }
        sizes.row_scales = 4 * scaled_products(store, blocks).iter().map(|&(_, rows, _)| rows).sum::<u64>();
        Ok(sizes)
    }

    /// Places the weights that `blocks` (run in order) read, as `strategy`
    /// says. Weights several blocks read are resident under every strategy.
    /// Streaming reads weights from `store` as each block starts: a
    /// component stored as DF11 must be expanded on the host first.
    ///
    /// Every buffer the weights keep is allocated before the first byte is
    /// written, so a device that cannot hold them fails here at once, not
    /// after gigabytes of uploads.
    pub fn for_blocks(gpu: &Gpu, store: &WeightStore, blocks: &[Vec<Op>], strategy: WeightStrategy) -> Result<Self, RunError> {
        let a = Assignment::new(store, blocks);
        let mut w = Self {
            fills: vec![Vec::new(); blocks.len()],
            streams: vec![Vec::new(); blocks.len()],
            streamed_groups: blocks.iter().map(|_| Vec::new()).collect(),
            ..Self::default()
        };
        let mut pending = Pending::default();
        let mut area_bytes = 0u64;
        for name in &a.shared.plain {
            w.allocate(gpu, store, name, &mut pending)?;
        }
        for &g in &a.shared.groups {
            w.allocate_expansion(gpu, store, g, &mut pending)?;
        }
        let expand_all = strategy == WeightStrategy::ResidentBf16;
        // On the half-precision data path a linear's weight in GGML blocks
        // expanded at load goes straight into f16 rows where it can.
        let half_rows = gpu.plan_limits().half_operands.then(|| product_shapes(blocks));
        for name in &a.expanded {
            w.allocate_quantized_expansion(gpu, store, name, None, &mut pending)?;
        }
        if expand_all {
            for name in &a.shared.quantized {
                w.allocate_quantized_expansion(gpu, store, name, half_rows.as_ref(), &mut pending)?;
            }
        }
        if !expand_all {
            for name in &a.shared.quantized {
                w.allocate_packed(gpu, store, name, &mut pending)?;
            }
            // Bound whole as a linear's weight: within one binding.
            let scratch = packed_scratch_bytes(store, &a)?.min(gpu.max_binding() / 4 * 4);
            if scratch > 0 {
                let buffer = gpu.storage("packed scratch", scratch);
                w.bytes += buffer.size();
                w.packed_scratch = Some(buffer);
            }
        }
        let slots = match strategy {
            WeightStrategy::ResidentBf16 => 0,
            WeightStrategy::ResidentDf11 { slots } | WeightStrategy::Streamed { slots } => (slots as usize).clamp(1, 2),
        };
        let mut slot_bytes = vec![0u64; slots];
        // (weight, slot, element offset) of the weights that live in a slot.
        let mut in_slots: Vec<(String, usize, u64, WeightDtype)> = Vec::new();
        // (tensor, slot, byte offset) of the streamed tensors in GGML blocks.
        let mut packed_in_slots: Vec<(String, usize, u64, GgmlType, f32, u64)> = Vec::new();
        for (block, held) in a.own.iter().enumerate() {
            let slot = if slots > 0 { block % slots } else { 0 };
            let mut cursor = 0u64;
            for name in &held.plain {
                let t = store.tensor(name)?;
                if matches!(strategy, WeightStrategy::Streamed { .. }) && streamable(t) {
                    let offset = cursor.next_multiple_of(SLOT_ALIGN);
                    cursor = offset + t.bytes.len() as u64;
                    let dtype = if t.dtype == Dtype::F32 { WeightDtype::F32 } else { WeightDtype::Bf16 };
                    in_slots.push((name.clone(), slot, offset / dtype.bytes(), dtype));
                    w.streams[block].push(StreamedWeight { name: name.clone(), slot, offset });
                } else {
                    w.allocate(gpu, store, name, &mut pending)?;
                }
            }
            for &g in &held.groups {
                match strategy {
                    WeightStrategy::ResidentBf16 => w.allocate_expansion(gpu, store, g, &mut pending)?,
                    WeightStrategy::ResidentDf11 { .. } => {
                        let group = compressed(store, g)?;
                        let base = place_group(&mut cursor, &mut in_slots, group_info(store, g)?, &group, slot);
                        let device = Df11DeviceGroup::allocate(gpu, &group);
                        w.bytes += device.device_bytes();
                        w.fills[block].push(SlotFill { group: w.groups.len(), slot, base });
                        pending.compressed.push((w.groups.len(), g));
                        w.groups.push(device);
                    }
                    WeightStrategy::Streamed { .. } => {
                        let group = compressed(store, g)?;
                        let base = place_group(&mut cursor, &mut in_slots, group_info(store, g)?, &group, slot);
                        area_bytes = area_bytes.max(area_bytes_of(&group, area_align(gpu)));
                        let positions = block_positions(&group);
                        w.streamed_groups[block].push(StreamedGroup { group: g, slot, base, positions, clear: Vec::new(), runs: Vec::new() });
                    }
                }
            }
            for name in &held.quantized {
                match strategy {
                    WeightStrategy::ResidentBf16 => w.allocate_quantized_expansion(gpu, store, name, half_rows.as_ref(), &mut pending)?,
                    WeightStrategy::ResidentDf11 { .. } => w.allocate_packed(gpu, store, name, &mut pending)?,
                    WeightStrategy::Streamed { .. } => {
                        // Copied into the slot as stored, like a plain tensor.
                        let q = quantized(store, name)?;
                        let offset = cursor.next_multiple_of(SLOT_ALIGN);
                        cursor = offset + q.bytes() as u64;
                        let width = q.shape.last().copied().unwrap_or(1) as u64;
                        packed_in_slots.push((name.clone(), slot, offset, q.ggml, q.scale, width));
                        w.streams[block].push(StreamedWeight { name: name.clone(), slot, offset });
                    }
                }
            }
            if slots > 0 {
                slot_bytes[slot] = slot_bytes[slot].max(cursor);
            }
        }
        // Slots hold whole u32 words: an odd group's last element shares one.
        slot_bytes.retain(|&n| n > 0);
        w.slots = slot_bytes.iter().enumerate().map(|(i, &n)| gpu.storage(&format!("weight slot {i}"), n)).collect();
        w.bytes += w.slot_bytes();
        if area_bytes > 0 {
            // A group larger than the area streams through it in runs of blocks.
            let area = gpu.storage("df11 streaming area", area_bytes.min(DF11_STREAM_AREA));
            w.bytes += area.size();
            for sg in w.streamed_groups.iter_mut().flatten() {
                let group = compressed(store, sg.group)?;
                let runs = AreaRun::cut(&group, &sg.positions, area.size(), area_align(gpu)).map_err(not_as_placed)?;
                let slot = &w.slots[sg.slot];
                if let Some(first) = runs.first() {
                    kernels::df11_clear(gpu, &mut sg.clear, first.arrays(&area, &group, &sg.positions), slot, sg.base)?;
                }
                for run in runs {
                    let mut decode = Vec::new();
                    kernels::df11_decode_blocks(gpu, &mut decode, run.arrays(&area, &group, &sg.positions), slot, sg.base, run.blocks.clone())?;
                    sg.runs.push((run, decode));
                }
            }
            w.area = Some(area);
        }
        if w.streams.iter().any(|s| !s.is_empty()) || area_bytes > 0 {
            let largest = slot_bytes.iter().copied().max().unwrap_or(0);
            let staging = gpu.upload_staging("weight staging", largest.min(STREAM_STAGING));
            w.bytes += staging.size();
            w.staging = Some(Staging { buffer: staging, mapped: Arc::new(AtomicBool::new(true)), copied: Default::default() });
        }
        let slotted: std::collections::HashSet<String> = in_slots.iter().map(|(name, ..)| name.clone()).collect();
        for (name, slot, offset, dtype) in in_slots {
            w.map.insert(name, DeviceWeight { buffer: w.slots[slot].clone(), offset, dtype, scales: None, taps_last: false, half_packed: false });
        }
        for (name, slot, at, ggml, scale, width) in packed_in_slots {
            w.packed.insert(name, Packed { buffer: w.slots[slot].clone(), at, ggml, scale, width });
        }
        if gpu.measures_weight_rows() {
            w.place_scales(gpu, scaled_products(store, blocks));
            w.slot_scales = blocks
                .iter()
                .map(|block| product_weights(std::slice::from_ref(block)).into_iter().map(|(name, ..)| name).filter(|name| slotted.contains(name) && w.map.get(name).is_some_and(|w| w.scales.is_some())).collect())
                .collect();
            if gpu.plan_limits().half_operands {
                // A slot's weights belong to one block, whose fills refill
                // them (stream_in, the DF11 decodes) before every run of its
                // dispatches: packed there after their measure, so every
                // product reads them packed.
                for name in w.slot_scales.iter().flatten() {
                    if let Some(weight) = w.map.get_mut(name).filter(|weight| weight.packable()) {
                        weight.half_packed = true;
                    }
                }
            }
        }
        gpu.check_faults()?;
        w.write(gpu, store, pending)?;
        let in_slots: std::collections::HashSet<&String> = w.slot_scales.iter().flatten().collect();
        // Those expanded from GGML blocks into f16 rows have their scales already.
        let resident: Vec<String> =
            w.map.iter().filter(|(name, weight)| weight.scales.is_some() && !weight.half_packed && !in_slots.contains(name)).map(|(name, _)| name.clone()).collect();
        w.measure_scales(gpu, &resident)?;
        if gpu.plan_limits().half_operands {
            // The resident products' W packed as f16 under their kept
            // scales: each product stages W's words as they are. A slot's
            // weights are measured and packed each time its block refills
            // it (record_fills).
            w.pack_half(gpu, &resident)?;
        }
        Ok(w)
    }

    /// Gives each weight of `weights` (name, rows, terms a row) that is held
    /// plain and has none yet a place for its rows' range scales, in one
    /// buffer for all of them (measured later: `measure_scales`, or a
    /// block's `record_fills`).
    fn place_scales(&mut self, gpu: &Gpu, weights: Vec<(String, u64, u64)>) {
        let weights: Vec<(String, u64, u64)> = weights.into_iter().filter(|(name, ..)| self.map.get(name).is_some_and(|w| w.scales.is_none())).collect();
        let rows: u64 = weights.iter().map(|&(_, rows, _)| rows).sum();
        if rows == 0 {
            return;
        }
        let buffer = gpu.storage("weight row scales", 4 * rows);
        self.bytes += buffer.size();
        let mut offset = 0;
        for (name, rows, k) in weights {
            if let Some(weight) = self.map.get_mut(&name) {
                weight.scales = Some(StoredScales { buffer: buffer.clone(), offset, rows, k });
            }
            offset += rows;
        }
    }

    /// Measures the range scales of the weights `names`, in one submission.
    fn measure_scales(&self, gpu: &Gpu, names: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), GpuError> {
        let weights = names.into_iter().map(|name| self.get(name.as_ref())).collect::<Result<Vec<_>, _>>()?;
        if weights.is_empty() {
            return Ok(());
        }
        gpu.submit(|enc| weights.iter().try_for_each(|w| w.record_scales(gpu, enc)))
    }

    /// On a device that keeps weights' row scales (`Gpu::measures_weight_rows`),
    /// measures them now for the resident weights of `weights` (name, rows,
    /// terms a row): the products' weights of a component that uploads its
    /// tensors itself (`insert`).
    pub fn keep_row_scales(&mut self, gpu: &Gpu, weights: &[(String, u64, u64)]) -> Result<(), GpuError> {
        if !gpu.measures_weight_rows() {
            return Ok(());
        }
        self.place_scales(gpu, weights.to_vec());
        let names: Vec<&str> = weights.iter().map(|(name, ..)| name.as_str()).filter(|name| self.map.get(*name).is_some_and(|w| w.scales.is_some())).collect();
        self.measure_scales(gpu, &names)
    }

    /// Allocates a resident tensor's buffer; its bytes are written later.
    fn allocate(&mut self, gpu: &Gpu, store: &WeightStore, name: &str, pending: &mut Pending) -> Result<(), RunError> {
        if !self.map.contains_key(name) {
            let weight = DeviceWeight::allocate(gpu, &store.component, name, store.tensor(name)?)?;
            self.insert(name, weight);
            pending.tensors.push(name.to_string());
        }
        Ok(())
    }

    /// Allocates the buffer a linear's weight keeps its GGML blocks in; the
    /// blocks are written later.
    fn allocate_packed(&mut self, gpu: &Gpu, store: &WeightStore, name: &str, pending: &mut Pending) -> Result<(), RunError> {
        let q = quantized(store, name)?;
        let buffer = gpu.storage(name, q.bytes() as u64);
        self.bytes += buffer.size();
        let width = q.shape.last().copied().unwrap_or(1) as u64;
        self.packed.insert(name.to_string(), Packed { buffer, at: 0, ggml: q.ggml, scale: q.scale, width });
        pending.packed.push(name.to_string());
        Ok(())
    }

    /// A linear's weight held in GGML blocks, if `name` is one.
    pub fn packed(&self, name: &str) -> Option<&Packed> {
        self.packed.get(name)
    }

    /// Where linears over GGML blocks expand rows of them.
    pub fn packed_scratch(&self) -> Option<&DeviceBuffer> {
        self.packed_scratch.as_ref()
    }

    /// Allocates the buffer a tensor in GGML blocks is expanded into once,
    /// and maps it there; the expansion comes later. Where `products` (the
    /// half-precision data path's) read it as [`half_expansion`] says, its
    /// rows go into f16 words under their range scales, which follow them
    /// in the buffer: a packed weight with its scales kept, as a product
    /// reads a resident bf16 one packed at load. Else they go into f32.
    fn allocate_quantized_expansion(&mut self, gpu: &Gpu, store: &WeightStore, name: &str, products: Option<&assignment::ProductShapes>, pending: &mut Pending) -> Result<(), RunError> {
        let q = quantized(store, name)?;
        let half = products.and_then(|p| half_expansion(&q, name, p));
        let buffer = gpu.storage(name, half.map_or(expanded_bytes(&q), HalfRows::bytes));
        self.bytes += buffer.size();
        let weight = match half {
            Some(h) => {
                let scales = StoredScales { buffer: buffer.clone(), offset: h.scales_at(), rows: h.rows, k: h.k };
                DeviceWeight { buffer: buffer.clone(), offset: 0, dtype: WeightDtype::Bf16, scales: Some(scales), taps_last: false, half_packed: true }
            }
            None => DeviceWeight { buffer: buffer.clone(), offset: 0, dtype: WeightDtype::F32, scales: None, taps_last: false, half_packed: false },
        };
        self.map.insert(name.to_string(), weight);
        pending.quantized_expansions.push((name.to_string(), buffer, half));
        Ok(())
    }

    /// Allocates the bf16 buffer group `group` is expanded into once, and
    /// maps its weights there; the expansion comes later.
    fn allocate_expansion(&mut self, gpu: &Gpu, store: &WeightStore, group: usize, pending: &mut Pending) -> Result<(), RunError> {
        let g = compressed(store, group)?;
        let info = group_info(store, group)?;
        let buffer = gpu.storage(&info.module, 2 * (g.n_elements() as u64).next_multiple_of(2));
        self.bytes += buffer.size();
        for (name, elements) in info.weights.iter().zip(g.weight_ranges()) {
            let w = DeviceWeight { buffer: buffer.clone(), offset: elements.start as u64, dtype: WeightDtype::Bf16, scales: None, taps_last: false, half_packed: false };
            self.map.insert(name.clone(), w);
        }
        pending.expansions.push((group, buffer));
        Ok(())
    }

    /// Writes what [`Self::for_blocks`] allocated: plain tensors, compressed
    /// groups, and each group expanded at load (its compressed arrays live
    /// only while it expands).
    fn write(&self, gpu: &Gpu, store: &WeightStore, pending: Pending) -> Result<(), RunError> {
        for name in &pending.tensors {
            self.get(name)?.fill(gpu, store.tensor(name)?);
        }
        for &(device, group) in &pending.compressed {
            self.groups[device].fill(gpu, &compressed(store, group)?);
        }
        for (group, buffer) in &pending.expansions {
            let device = Df11DeviceGroup::upload(gpu, &compressed(store, *group)?);
            gpu.submit(|enc| device.record_decode(gpu, enc, buffer, 0))?;
        }
        for name in &pending.packed {
            gpu.write(&self.packed[name].buffer, 0, &quantized(store, name)?.joined());
        }
        for (name, buffer, half) in &pending.quantized_expansions {
            let q = quantized(store, name)?;
            let raw = gpu.upload_bytes(name, &q.joined());
            let src = || kernels::GgmlBlocks { ggml: q.ggml, scale: q.scale, buf: &raw, at: 0 };
            match half {
                Some(h) => gpu.submit(|enc| kernels::ggml_expand_half(gpu, enc, src(), [h.rows, h.k], (buffer, 0), (buffer, h.scales_at())))?,
                None => {
                    let blocks = (q.elements() / q.ggml.block_elements()) as u64;
                    gpu.submit(|enc| kernels::ggml_expand(gpu, enc, src(), blocks, buffer, 0))?
                }
            }
        }
        Ok(())
    }

    /// Copies the weights block `block` streams from host memory into its
    /// slot, through the staging buffer, each batch by its own submission
    /// (before the block's), so the host refills it while the device
    /// computes. A DF11 group goes into the area compressed and is expanded
    /// into the slot by its own submission before the next group's copy.
    pub fn stream_in(&self, gpu: &Gpu, store: &WeightStore, block: usize) -> Result<(), RunError> {
        let Some(staging) = &self.staging else { return Ok(()) };
        let mut held = Vec::new();
        for s in self.streams.get(block).into_iter().flatten() {
            match store.quantized(&s.name) {
                Some(q) => held.push(q.joined()),
                None => held.push(std::borrow::Cow::Borrowed(store.tensor(&s.name)?.bytes)),
            }
        }
        let plain: Vec<Piece<'_>> =
            self.streams.get(block).into_iter().flatten().zip(&held).map(|(s, bytes)| Piece { bytes, to: &self.slots[s.slot], at: s.offset }).collect();
        staging.copy(gpu, &plain)?;
        for sg in self.streamed_groups.get(block).into_iter().flatten() {
            let area = self.area.as_ref().ok_or_else(|| GpuError::Device("no DF11 streaming area".into()))?;
            let group = compressed(store, sg.group)?;
            let f = group.fields();
            let positions: &[u8] = bytemuck::cast_slice(&sg.positions);
            for (i, (run, decode)) in sg.runs.iter().enumerate() {
                let pieces = [
                    area_piece(f.luts, &run.luts, area),
                    area_piece(f.encoded_exponent, &run.stream, area),
                    area_piece(f.sign_mantissa, &run.sign_mantissa, area),
                    area_piece(f.gaps, &run.gaps, area),
                    Piece { bytes: &GAPS_PAD, to: area, at: run.gaps.at + (run.gaps.source.len() as u64).next_multiple_of(4) },
                    area_piece(positions, &run.positions, area),
                ];
                staging.copy(gpu, &pieces)?;
                gpu.submit(|enc| {
                    if i == 0 {
                        flux_lite_kernels::encode(enc, &sg.clear);
                    }
                    flux_lite_kernels::encode(enc, decode);
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// Adds one uploaded tensor (components that upload a chosen subset of their files).
    pub fn insert(&mut self, name: &str, weight: DeviceWeight) {
        self.bytes += weight.buffer.size();
        self.map.insert(name.to_string(), weight);
    }

    /// Bytes of weights on the device, slots included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many weights the products read as packed f16 (resident ones
    /// packed at load, and a slot's, packed as its block refills it).
    pub fn half_packed(&self) -> usize {
        self.map.values().filter(|w| w.half_packed).count()
    }

    /// Bytes of the bf16 slots that groups are expanded into per block.
    pub fn slot_bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.size()).sum()
    }

    /// Records the expansions block `block` needs before its own dispatches,
    /// then the range scales of its slot's weights and, on the half-precision
    /// data path, their packs.
    pub fn record_fills(&self, gpu: &Gpu, block: usize, sink: &mut dyn flux_lite_kernels::Sink) -> Result<(), GpuError> {
        for fill in self.fills.get(block).into_iter().flatten() {
            self.groups[fill.group].record_decode(gpu, sink, &self.slots[fill.slot], fill.base)?;
        }
        for name in self.slot_scales.get(block).into_iter().flatten() {
            let weight = self.get(name)?;
            weight.record_scales(gpu, sink)?;
            if weight.half_packed {
                weight.record_pack_words(gpu, sink)?;
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Result<&DeviceWeight, GpuError> {
        self.map
            .get(name)
            .ok_or_else(|| GpuError::UnsupportedShape(format!("the program names weight `{name}`, which was not loaded")))
    }
}

/// Places a group's bf16 expansion in `slot` at the next aligned byte of
/// `cursor` (which it advances), maps each of its weights there, and
/// returns the group's first element in the slot.
fn place_group(
    cursor: &mut u64,
    in_slots: &mut Vec<(String, usize, u64, WeightDtype)>,
    info: &crate::model::safetensors_store::Df11GroupInfo,
    group: &flux_lite_core::df11::Df11Group<'_>,
    slot: usize,
) -> u64 {
    let base = cursor.next_multiple_of(SLOT_ALIGN);
    *cursor = base + 2 * group.n_elements() as u64;
    for (name, elements) in info.weights.iter().zip(group.weight_ranges()) {
        in_slots.push((name.clone(), slot, base / 2 + elements.start as u64, WeightDtype::Bf16));
    }
    base / 2
}

/// An array's piece of a run, on its way to its place in the area.
fn compressed(store: &WeightStore, group: usize) -> Result<flux_lite_core::df11::Df11Group<'_>, RunError> {
    store.df11_group(group).ok_or_else(|| missing_group(group))
}

fn group_info(store: &WeightStore, group: usize) -> Result<&crate::model::safetensors_store::Df11GroupInfo, RunError> {
    store.df11_groups().nth(group).ok_or_else(|| missing_group(group))
}

fn missing_group(group: usize) -> RunError {
    not_as_placed(format!("DF11 group {group} is not held compressed by its store"))
}

fn quantized<'s>(store: &'s WeightStore, name: &str) -> Result<QuantizedRef<'s>, RunError> {
    store.quantized(name).ok_or_else(|| not_as_placed(format!("`{name}` is not held in GGML blocks by its store")))
}

/// Weights not held as their placement says: a bug in the placement, never
/// the model's or the request's doing (the store was checked when opened).
fn not_as_placed(detail: String) -> RunError {
    RunError::Internal(detail)
}

//! A component's weights on the device, placed for its block programs.
//!
//! Plain tensors are uploaded once. A DF11 group stays compressed on the
//! device when one block alone reads it: `df11_decode` expands it into a
//! shared bf16 slot at the start of that block, so the bf16 weights of only
//! one block (or two, with two slots) exist at a time. Any other group is
//! expanded once, on the device, when it is loaded.

use crate::df11::Df11DeviceGroup;
use crate::error::{GpuError, LoadError, RunError};
use crate::gpu::Gpu;
use crate::ops::{self, Weight, WeightDtype};
use crate::safetensors_store::{widen_to_f32, TensorRef, WeightStore};
use flux_lite_core::program::Op;
use safetensors::tensor::Dtype;
use std::collections::HashMap;

/// Element alignment of a group in a slot (`df11_decode` starts groups on a binding boundary).
const GROUP_ALIGN: u64 = 128;

/// A weight tensor on the device: `buffer` from element `offset` on.
#[derive(Debug)]
pub struct DeviceWeight {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub dtype: WeightDtype,
}

impl DeviceWeight {
    /// Uploads a tensor as stored (bf16 or f32); f16 is widened to f32 on the host.
    pub fn upload(gpu: &Gpu, component: &str, name: &str, t: TensorRef<'_>) -> Result<Self, LoadError> {
        let (buffer, dtype) = match t.dtype {
            Dtype::BF16 => (gpu.upload_bytes(name, t.bytes), WeightDtype::Bf16),
            Dtype::F32 => (gpu.upload_bytes(name, t.bytes), WeightDtype::F32),
            Dtype::F16 => {
                let mut wide = Vec::with_capacity(t.bytes.len() / 2);
                widen_to_f32(t.dtype, t.bytes, &mut wide);
                (gpu.upload_f32(name, &wide), WeightDtype::F32)
            }
            other => {
                return Err(LoadError::WrongTensor {
                    component: component.into(),
                    name: name.into(),
                    expected: "a bf16, f16 or f32 tensor".into(),
                    found: format!("{other:?}"),
                })
            }
        };
        Ok(Self { buffer, offset: 0, dtype })
    }

    pub fn view(&self) -> Weight<'_> {
        Weight { buf: &self.buffer, offset: self.offset, dtype: self.dtype }
    }
}

/// Where the DF11 groups of a component are expanded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Df11Placement {
    /// Every group once, at load: the weights are resident as bf16.
    ExpandAtLoad,
    /// A group that one block alone reads stays compressed and is expanded
    /// at the start of that block into slot `block mod slots` (1 or 2 slots:
    /// with two, a block's expansion need not wait for the previous block).
    PerBlock { slots: usize },
}

/// A group expansion recorded at the start of a block.
#[derive(Debug, Clone, Copy)]
struct SlotFill {
    group: usize,
    slot: usize,
    /// First bf16 element of the group in the slot.
    base: u64,
}

/// Every weight a component's programs read, on the device.
#[derive(Debug, Default)]
pub struct DeviceWeights {
    map: HashMap<String, DeviceWeight>,
    /// Groups kept compressed, expanded per block.
    groups: Vec<Df11DeviceGroup>,
    slots: Vec<wgpu::Buffer>,
    /// The expansions at the start of each block.
    fills: Vec<Vec<SlotFill>>,
    /// Device bytes held: plain tensors, expanded groups, compressed groups, slots.
    bytes: u64,
}

impl DeviceWeights {
    /// Places the weights that `blocks` (run in order) read.
    pub fn for_blocks(gpu: &Gpu, store: &WeightStore, blocks: &[Vec<Op>], placement: Df11Placement) -> Result<Self, RunError> {
        let mut weights = Self::default();
        // Blocks reading each compressed group, in order of first use.
        let mut readers: Vec<(usize, Vec<usize>)> = Vec::new();
        for (b, block) in blocks.iter().enumerate() {
            for name in block.iter().flat_map(|op| op.weights()).map(|n| n.as_str()) {
                match store.df11_location(name) {
                    Some((group, _)) => match readers.iter_mut().find(|(g, _)| *g == group) {
                        Some((_, bs)) if bs.last() == Some(&b) => {}
                        Some((_, bs)) => bs.push(b),
                        None => readers.push((group, vec![b])),
                    },
                    None if !weights.map.contains_key(name) => {
                        let w = DeviceWeight::upload(gpu, &store.component, name, store.tensor(name)?)?;
                        weights.bytes += w.buffer.size();
                        weights.map.insert(name.to_string(), w);
                    }
                    None => {}
                }
            }
        }
        let slots = match placement {
            Df11Placement::PerBlock { slots } => slots.clamp(1, 2),
            Df11Placement::ExpandAtLoad => 0,
        };
        weights.fills = vec![Vec::new(); blocks.len()];
        let mut slot_elements = vec![0u64; slots];
        let mut cursor = vec![0u64; blocks.len()];
        // (weight, slot, first element) of the weights that live in a slot.
        let mut in_slots: Vec<(String, usize, u64)> = Vec::new();
        for (group, bs) in readers {
            match bs.as_slice() {
                &[block] if slots > 0 => {
                    let g = compressed(store, group)?;
                    let info = group_info(store, group)?;
                    let base = cursor[block].next_multiple_of(GROUP_ALIGN);
                    cursor[block] = base + g.n_elements() as u64;
                    let slot = block % slots;
                    slot_elements[slot] = slot_elements[slot].max(cursor[block]);
                    for (name, elements) in info.weights.iter().zip(g.weight_ranges()) {
                        in_slots.push((name.clone(), slot, base + elements.start as u64));
                    }
                    let device = Df11DeviceGroup::upload(gpu, &g);
                    weights.bytes += device.device_bytes();
                    weights.fills[block].push(SlotFill { group: weights.groups.len(), slot, base });
                    weights.groups.push(device);
                }
                _ => weights.expand_at_load(gpu, store, group)?,
            }
        }
        // Slots hold whole u32 words: an odd group's last element shares one.
        slot_elements.retain(|&n| n > 0);
        weights.slots =
            slot_elements.iter().enumerate().map(|(i, &n)| gpu.storage(&format!("bf16 weight slot {i}"), 2 * n.next_multiple_of(2))).collect();
        weights.bytes += weights.slot_bytes();
        for (name, slot, offset) in in_slots {
            let w = DeviceWeight { buffer: weights.slots[slot].clone(), offset, dtype: WeightDtype::Bf16 };
            weights.map.insert(name, w);
        }
        Ok(weights)
    }

    /// Expands group `group` once into its own bf16 buffer and maps its weights there.
    fn expand_at_load(&mut self, gpu: &Gpu, store: &WeightStore, group: usize) -> Result<(), RunError> {
        let g = compressed(store, group)?;
        let device = Df11DeviceGroup::upload(gpu, &g);
        let info = group_info(store, group)?;
        let buffer = gpu.storage(&info.module, 2 * device.n_elements().next_multiple_of(2));
        gpu.submit(|enc| device.record_decode(gpu, enc, &buffer, 0))?;
        self.bytes += buffer.size();
        for (name, elements) in info.weights.iter().zip(g.weight_ranges()) {
            let w = DeviceWeight { buffer: buffer.clone(), offset: elements.start as u64, dtype: WeightDtype::Bf16 };
            self.map.insert(name.clone(), w);
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

    /// Bytes of the bf16 slots that groups are expanded into per block.
    pub fn slot_bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.size()).sum()
    }

    /// Records the expansions block `block` needs before its own dispatches.
    pub fn record_fills(&self, gpu: &Gpu, block: usize, sink: &mut dyn ops::Sink) -> Result<(), GpuError> {
        for fill in self.fills.get(block).into_iter().flatten() {
            self.groups[fill.group].record_decode(gpu, sink, &self.slots[fill.slot], fill.base)?;
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Result<&DeviceWeight, GpuError> {
        self.map
            .get(name)
            .ok_or_else(|| GpuError::UnsupportedShape(format!("the program names weight `{name}`, which was not loaded")))
    }
}

fn compressed(store: &WeightStore, group: usize) -> Result<flux_lite_core::df11::Df11Group<'_>, RunError> {
    store.df11_group(group).ok_or_else(|| missing_group(group))
}

fn group_info(store: &WeightStore, group: usize) -> Result<&crate::safetensors_store::Df11GroupInfo, RunError> {
    store.df11_groups().nth(group).ok_or_else(|| missing_group(group))
}

fn missing_group(group: usize) -> RunError {
    RunError::Input(format!("DF11 group {group} is not held compressed by its store"))
}

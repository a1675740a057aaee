//! `flux-lite info`: a model folder's configs, sizes and memory plan, without
//! running it; or the settings an image carries (`flux-lite info IMAGE.png`).

use crate::stdout::say;
use argh::FromArgs;
use flux_lite_core::df11::layout;
use flux_lite_core::plan::{self as planner, Bytes, ComponentBytes, DeviceLimits, PhasePlan, PlanInput, Sides, VaePlan};
use flux_lite_core::models::tensors;
use flux_lite_platform::model::{Component, ModelFolder};
use flux_lite_platform::pipeline::planning::ModelSizes;
use flux_lite_platform::pipeline::{self, PROMPT_TOKENS};
use flux_lite_platform::{Gpu, Job, Limits, Prompt};
use std::path::PathBuf;

/// Print a model folder's configuration, weight sizes and memory plan without
/// running it (the folder may hold only its config files); or, given an
/// image, the settings it was made with.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "info")]
pub struct InfoArgs {
    /// an image (PNG) to print the settings of, as flux-lite or AUTOMATIC1111 wrote them
    #[argh(positional)]
    file: Option<PathBuf>,
    /// the diffusers model folder (model_index.json, transformer/, text_encoder/, vae/, scheduler/)
    #[argh(option)]
    model: Option<PathBuf>,
    /// read the transformer from this folder instead of the model's transformer/, or from a GGUF file (BFL's tensor names, as ComfyUI-GGUF and stable-diffusion.cpp write them)
    #[argh(option)]
    transformer: Option<PathBuf>,
    /// read the text encoder from a GGUF file (llama.cpp's Qwen3 layout, e.g. Qwen3-4B-Q8_0.gguf) instead of the model's text_encoder/
    #[argh(option)]
    text_encoder: Option<PathBuf>,
    /// a reference image (PNG or JPEG) to plan for, prepared as gen --image prepares it; repeat for up to 16
    #[argh(option)]
    image: Vec<PathBuf>,
    /// image width the plan is for, in pixels (default: the first reference image's, else 1024)
    #[argh(option)]
    width: Option<usize>,
    /// image height the plan is for, in pixels (default: the first reference image's, else 1024)
    #[argh(option)]
    height: Option<usize>,
    /// a LoRA adapter to plan with, FILE[:SCALE] as for gen (its bytes on the device are printed); repeat for several
    #[argh(option, from_str_fn(crate::lora::parse_lora))]
    lora: Vec<flux_lite_platform::model::lora::LoraSpec>,
    /// also plan the run within this memory (device and host together), e.g. 2GiB (fails, naming the minimum, when too small)
    #[argh(option, from_str_fn(crate::budget::parse_memory_budget))]
    memory_budget: Option<u64>,
    /// the device limits to plan under: adapter (this machine's, the default), webgpu (WebGPU's defaults, which every adapter grants), or BUFFER/BINDING such as 4GiB/4GiB
    #[argh(option, from_str_fn(crate::budget::parse_limits))]
    limits: Option<Option<DeviceLimits>>,
    /// the precision tier to plan for: f32, f16 or matrix (whose half-precision data path lays out smaller activations); default: the adapter's, or f32 with --limits
    #[argh(option, from_str_fn(crate::tier::parse_precision))]
    precision: Option<flux_lite_platform::Precision>,
}

pub fn run(args: &InfoArgs) -> Result<(), String> {
    let model_dir = match (&args.file, &args.model) {
        (Some(file), None) => return print_settings(file),
        (Some(file), Some(_)) => return Err(format!("info {}: give an image or --model DIR, not both", file.display())),
        (None, None) => return Err("give --model DIR (a model's configs and plan) or an image file (the settings it carries)".into()),
        (None, Some(dir)) => dir,
    };
    let model = pipeline::open_model(model_dir, args.transformer.as_deref(), args.text_encoder.as_deref()).map_err(|e| e.to_string())?;
    print_configs(&model);
    for c in Component::ALL {
        print_component_bytes(&model, c)?;
    }
    // The size and references as `gen` would resolve them.
    let job = Job { width: args.width, height: args.height, references: crate::references::load(&args.image, &model)?, ..Job::new(Prompt::text("")) };
    let job = job.resolve(&model, &Limits::default()).map_err(|e| crate::errors::request_line(&e))?;
    let (width, height) = (job.request().width, job.request().height);
    let references = job.references();
    let reference_sizes: Vec<(u64, u64)> = references.iter().map(|r| (r.width as u64, r.height as u64)).collect();
    let mut sizes = ModelSizes::from_files_or_configs(&model).map_err(|e| e.to_string())?;
    if !args.lora.is_empty() {
        let lora = crate::lora::open_lora(&args.lora, &model.transformer, false)?;
        let sized: Vec<(usize, usize)> = references.iter().map(|r| (r.width, r.height)).collect();
        let rows = flux_lite_platform::pipeline::planning::transformer_rows(&model, width, height, &sized).map_err(|e| e.to_string())?;
        say!();
        for adapter in &lora.adapters {
            say!("lora: {}", adapter.summary());
        }
        let bytes = lora.device_bytes(rows);
        say!(
            "lora: {} on the device in all ({} B): the combined matrices (f32, resident under every strategy) and a {rows}×{} scratch for x·Aᵀ; on the host only the mapped files",
            Bytes(bytes),
            bytes,
            lora.max_rank()
        );
        sizes.add_lora(&lora, rows);
    }
    let (limits, adapter, offered) = match args.limits.flatten() {
        Some(l) if l == DeviceLimits::WEBGPU_DEFAULT => (l, "WebGPU's default limits (--limits webgpu)".to_string(), None),
        Some(l) => (l, "the limits given (--limits)".to_string(), None),
        None => adapter_limits(),
    };
    // A tier asked for: the matrix tier's products take f16 inputs (auto keeps what the limits say).
    let limits = match args.precision {
        Some(flux_lite_platform::Precision::Auto) | None => limits,
        Some(p) => DeviceLimits { half_operands: p == flux_lite_platform::Precision::Matrix, ..limits },
    };
    if limits.half_operands {
        // The matrix tier keeps its weights' row scales, and expands GGML
        // blocks at load into f16 rows.
        sizes.keep_row_scales();
        sizes.expand_half();
    }
    let input = sizes.plan_input(&model, width, height, &reference_sizes, limits, args.memory_budget);
    say!();
    let with_references = match reference_sizes.as_slice() {
        [] => String::new(),
        sizes => format!(" and reference images of {}", sizes.iter().map(|(w, h)| format!("{w}×{h}")).collect::<Vec<_>>().join(", ")),
    };
    say!(
        "plan for {width}×{height} with {PROMPT_TOKENS} prompt tokens{with_references}, under {adapter}: max buffer {}, max binding {}",
        Bytes(limits.max_buffer),
        Bytes(limits.max_binding)
    );
    if input.kv_cache && !reference_sizes.is_empty() {
        let cell = model.vae.latent_cell() as u64;
        for r in references {
            let tokens = (r.width as u64 / cell) * (r.height as u64 / cell);
            let bytes = flux_lite_core::models::transformer::kv_cache_bytes(&model.transformer, tokens);
            say!("kv cache: {} ({tokens} tokens): {} ({bytes} B) of keys and values in f32", r.path.display(), Bytes(bytes));
        }
        say!("kv cache: kept in the transformer's arena when the budget holds it, else recomputed each step (the same image)");
    }
    print_plan_options(&input, &sizes)?;
    let minimum = planner::minimum_need(&input).map_err(|e| crate::errors::plan_line(&e))?;
    say!("smallest budget for the whole run: {} ({} B): {}", Bytes(minimum.total()), minimum.total(), Sides(minimum.device, minimum.host));
    let resident = planner::plan(&PlanInput { budget: None, ..input }).map_err(|e| crate::errors::plan_line(&e))?;
    say!("everything resident: {}: {}", Bytes(resident.peak()), Sides(resident.device_peak(), resident.host_peak()));
    // The budget gen would run under: the one given, else the adapter's default.
    let default = offered.filter(|_| args.memory_budget.is_none());
    if let Some(m) = default {
        say!("{}", crate::budget::default_line(&m));
    }
    let budget = args.memory_budget.or(default.map(|m| m.default_budget()));
    let input = PlanInput { budget, ..input };
    let run = planner::plan(&input).map_err(|e| crate::errors::plan_line(&e))?;
    let binding = planner::largest_binding(&input, &run).map_err(|e| crate::errors::plan_line(&e))?;
    say!(
        "largest buffer: {} B, largest binding: {binding} B (the adapter's: {} B and {} B)",
        run.largest_buffer(),
        limits.max_buffer,
        limits.max_binding
    );
    if let Some(budget) = budget {
        let plan = run;
        let encoder = plan.references.map_or(String::new(), |r| format!("; VAE encoder {}", tile_layout(r.tile)));
        let within = if args.memory_budget.is_some() { "--memory-budget" } else { "the default budget" };
        say!(
            "within {within} {}: text encoder {}; transformer {}{encoder}; VAE {}; peak {} (largest phase), at most {} on the device and {} on the host",
            Bytes(budget),
            plan.encode.weights,
            plan.denoise,
            decode_layout(plan.decode.tile, plan.decode.on_device),
            Bytes(plan.peak()),
            Bytes(plan.device_peak()),
            Bytes(plan.host_peak())
        );
    }
    Ok(())
}

fn print_configs(m: &ModelFolder) {
    let t = &m.transformer;
    let q = &m.text_encoder;
    let v = &m.vae;
    say!("model: {}", m.root.display());
    say!("distilled: {}", m.index.is_distilled);
    say!(
        "transformer: {} double + {} single blocks, {} heads × {}, inner {}, mlp {}, joint {}, in {} channels, RoPE axes {:?} θ {}",
        t.num_layers,
        t.num_single_layers,
        t.num_attention_heads,
        t.attention_head_dim,
        t.inner_dim(),
        t.mlp_hidden_dim(),
        t.joint_attention_dim,
        t.in_channels,
        t.axes_dims_rope.as_slice(),
        t.rope_theta
    );
    say!(
        "text encoder: Qwen3 {} layers, hidden {}, {} / {} heads × {}, mlp {}, vocab {}, RoPE θ {}, prompt layers {:?}",
        q.num_hidden_layers,
        q.hidden_size,
        q.num_attention_heads,
        q.num_key_value_heads,
        q.head_dim,
        q.intermediate_size,
        q.vocab_size,
        q.rope_theta,
        q.output_layers()
    );
    say!(
        "vae: channels {:?}, {} latent channels, scale factor {}, {} groups",
        v.block_out_channels.as_slice(),
        v.latent_channels,
        v.scale_factor(),
        v.norm_num_groups
    );
}

/// One line: parameters, bf16 and DF11 bytes, and what the files hold.
fn print_component_bytes(m: &ModelFolder, c: Component) -> Result<(), String> {
    let bytes: ComponentBytes = match c {
        Component::Transformer => planner::component_bytes(&mut |sink| tensors::transformer(&m.transformer, sink), layout::TRANSFORMER_GROUPS),
        Component::TextEncoder => planner::component_bytes(&mut |sink| tensors::text_encoder(&m.text_encoder, sink), layout::TEXT_ENCODER_GROUPS),
        Component::Vae => planner::component_bytes(&mut |sink| tensors::vae(&m.vae, sink), &[]),
    };
    let files = if m.has_weight_files(c) {
        let store = m.weights(c).map_err(|e| e.to_string())?;
        let types = store.quantized_types();
        let kind = if !types.is_empty() {
            let listed: Vec<String> = types.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
            format!("quantized: {} tensors, expanded on the device", listed.join(", "))
        } else if store.df11_groups().len() > 0 {
            "DF11".to_string()
        } else {
            "uncompressed".to_string()
        };
        format!("{} in files ({kind})", Bytes(store.data_bytes()))
    } else {
        "no weight files".to_string()
    };
    let df11 = if bytes.df11 < bytes.bf16 { format!("DF11 about {}", Bytes(bytes.df11)) } else { "no DF11 groups".to_string() };
    say!("{}: {} parameters; bf16 {}, {df11}; {files}", c.dir(), bytes.parameters, Bytes(bytes.bf16));
    Ok(())
}

/// The limits `gen` would plan under on this machine (the adapter's, or
/// WebGPU's defaults without one), and the memory the adapter offers.
fn adapter_limits() -> (DeviceLimits, String, Option<flux_lite_platform::AdapterMemory>) {
    match crate::env_gpu_options().and_then(|o| Gpu::new(&o).map_err(|e| e.to_string())) {
        Ok(gpu) => (gpu.plan_limits(), format!("the limits of {}", gpu.describe()), gpu.memory_offered()),
        Err(_) => (DeviceLimits::WEBGPU_DEFAULT, "WebGPU's default limits (no adapter found)".to_string(), None),
    }
}

/// Each phase's options, fastest first, with the bytes each needs.
fn print_plan_options(input: &PlanInput<'_>, sizes: &ModelSizes) -> Result<(), String> {
    let source = |c: Component| match (sizes.estimated.contains(&c), c) {
        (false, _) => String::new(),
        (true, Component::Vae) => " (sizes estimated from the config)".to_string(),
        (true, _) => format!(" (sizes estimated from the config, DF11 groups at {}%)", planner::DF11_ESTIMATE_PERCENT),
    };
    say!("text encoder{}:", source(Component::TextEncoder));
    for p in planner::encode_options(input).map_err(|e| e.to_string())? {
        print_phase(&p);
    }
    say!("transformer{}:", source(Component::Transformer));
    for p in planner::denoise_options(input).map_err(|e| e.to_string())? {
        print_phase(&p);
    }
    if !input.references.is_empty() {
        say!("vae encoder{}:", source(Component::Vae));
        print_fastest_and_smallest(&planner::reference_options(input).map_err(|e| e.to_string())?.collect::<Vec<_>>());
    }
    say!("vae decoder{}:", source(Component::Vae));
    print_fastest_and_smallest(&planner::decode_options(input).map_err(|e| e.to_string())?.collect::<Vec<_>>());
    Ok(())
}

/// A VAE phase's fastest layout and, when different, its smallest.
fn print_fastest_and_smallest(options: &[VaePlan]) {
    let fastest = options.first();
    let smallest = options.iter().min_by_key(|p| p.peak());
    for p in fastest.into_iter().chain(smallest.filter(|s| Some(*s) != fastest)) {
        print_option(&tile_layout(p.tile), [p.weight_bytes, p.arena_bytes, p.other_bytes], p.host_bytes);
    }
}

fn print_phase(p: &PhasePlan) {
    print_option(&p.to_string(), [p.weight_bytes, p.arena_bytes, p.other_bytes], p.host_bytes);
}

/// One option of a phase: what it is, its peak, the device's part (weights,
/// activations, other) and the host's.
fn print_option(what: &str, [weights, activations, other]: [u64; 3], host: u64) {
    let device = weights + activations + other;
    say!(
        "  {what}: {} = device {} (weights {}, activations {}, other {}) + host {}",
        Bytes(device + host),
        Bytes(device),
        Bytes(weights),
        Bytes(activations),
        Bytes(other),
        Bytes(host)
    );
}

/// The decode's layout in words: [`tile_layout`]'s, or bands of a binding with the activations on the device.
fn decode_layout(tile: Option<u64>, on_device: bool) -> String {
    match (tile, on_device) {
        (Some(_), true) => "by bands of one binding, activations on the device".to_string(),
        _ => tile_layout(tile),
    }
}

fn tile_layout(tile: Option<u64>) -> String {
    match tile {
        None => "untiled".to_string(),
        Some(tile) => format!("by bands of {tile}-pixel tiles"),
    }
}

/// The settings an image carries, a line each, and how to make it again.
fn print_settings(file: &std::path::Path) -> Result<(), String> {
    use crate::recipe::{Carried, Source};
    let shown = file.display();
    let from = crate::recipe::read_image_file(file)?;
    match &from.carried {
        Carried::Recipe(r) => {
            let source = |s: &Source| match s {
                Source::File(f) => f.clone(),
                Source::Sent(field) if from.input(field).is_some() => format!("{field} (sent to a server; kept in the image)"),
                Source::Sent(field) => format!("{field} (sent to a server; not in the image)"),
            };
            say!("{shown}: made by {}", r.software);
            say!("prompt: {}", r.prompt);
            if !r.negative_prompt.is_empty() {
                say!("negative prompt: {}", r.negative_prompt);
            }
            if let Some(e) = &r.embeddings {
                say!("embeddings: {e}");
            }
            say!("model: {} (folder {}, weights {})", r.model.name, r.model.folder, r.model.weights);
            for (what, replaced) in [("transformer", &r.transformer), ("text encoder", &r.text_encoder)] {
                if let Some(path) = replaced {
                    say!("{what}: {path}");
                }
            }
            say!("size: {}x{}", r.width, r.height);
            say!("steps: {}", r.steps);
            say!("guidance: {}", r.guidance);
            say!("seed: {}", r.seed);
            for l in &r.lora {
                say!("lora: {}:{}", l.file, l.scale);
            }
            for reference in &r.references {
                say!("reference image: {}", source(reference));
            }
            if let Some(init) = &r.init {
                say!("init image: {}", source(&init.image));
                if let Some(mask) = &init.mask {
                    say!("mask: {}", source(mask));
                }
                say!("strength: {}", init.strength);
                if let Some(pad) = init.mask_crop {
                    say!("mask crop: {pad} pixels");
                }
            }
            say!("precision: {} on {}", r.precision, r.adapter);
            if let Some(budget) = r.memory_budget {
                say!("memory budget: {} ({budget} B)", Bytes(budget));
            }
            if let Some(tile) = r.vae_tile {
                say!("VAE tile: {tile} pixels");
            }
            say!("kv cache: {}, kv precision: {}", if r.kv_cache { "on" } else { "off" }, r.kv_precision);
            say!("again: flux-lite gen --from {shown} --output again.png");
        }
        Carried::Infotext(info) => {
            say!("{shown}: AUTOMATIC1111's settings (parameters)");
            say!("prompt: {}", info.prompt);
            if !info.negative_prompt.is_empty() {
                say!("negative prompt: {}", info.negative_prompt);
            }
            for (key, value) in &info.fields {
                say!("{key}: {value}");
            }
            say!("again: flux-lite gen --from {shown} --model DIR --output again.png (its prompts, seed, steps, CFG scale and size)");
        }
    }
    Ok(())
}

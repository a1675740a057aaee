//! `flux-lite compress`: a model folder → the same folder with DF11 weights.

use crate::stdout::say;
use flux_lite_core::plan::Bytes;
use crate::progress::Bar;
use argh::FromArgs;
use flux_lite_platform::model::compress::{self, ComponentSizes};
use flux_lite_platform::model::{Component, ModelFolder};
use std::path::PathBuf;
use std::time::Instant;

/// Write a copy of a model folder whose transformer (and, on request, text encoder) weights are DFloat11, losslessly, in the official layout.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "compress")]
pub struct CompressArgs {
    /// the diffusers model folder to compress
    #[argh(option)]
    model: PathBuf,
    /// the new model folder to write (must not exist)
    #[argh(option)]
    output: PathBuf,
    /// components to compress, comma-separated: transformer, text_encoder (default: transformer)
    #[argh(option, default = "String::from(\"transformer\")")]
    components: String,
    /// no progress bar
    #[argh(switch)]
    quiet: bool,
}

pub fn run(args: &CompressArgs) -> Result<(), String> {
    let started = Instant::now();
    let components = parse_components(&args.components)?;
    let model = ModelFolder::open(&args.model).map_err(|e| e.to_string())?;
    let mut bar = Bar::new(args.quiet);
    let sizes = compress::compress_model(&model, &args.output, &components, &mut |p| {
        bar.draw(p.component.dir(), p.done, p.total, &format!("group {}/{}", p.done, p.total));
        if p.done == p.total {
            bar.finish(); // each component's bar on its own line
        }
    });
    bar.finish();
    for s in sizes.map_err(|e| crate::errors::compress_line(&e))? {
        say!("{}", summary(&s));
    }
    eprintln!("wrote {} in {:.2}s", args.output.display(), started.elapsed().as_secs_f64());
    Ok(())
}

/// `transformer: 7.2 GiB → 5.1 GiB (70.1%) in 30 DF11 groups; component 7.2 GiB → 5.1 GiB (70.2%)`
fn summary(s: &ComponentSizes) -> String {
    let percent = |after: u64, before: u64| 100.0 * after as f64 / before.max(1) as f64;
    format!(
        "{}: {} → {} ({:.1}%) in {} DF11 groups; component {} → {} ({:.1}%)",
        s.component.dir(),
        Bytes(s.weights_bf16),
        Bytes(s.weights_df11),
        percent(s.weights_df11, s.weights_bf16),
        s.groups,
        Bytes(s.total_before),
        Bytes(s.total_after),
        percent(s.total_after, s.total_before)
    )
}

fn parse_components(list: &str) -> Result<Vec<Component>, String> {
    let mut components = Vec::new();
    for name in list.split(',').map(str::trim) {
        let component = match name {
            "transformer" => Component::Transformer,
            "text_encoder" => Component::TextEncoder,
            "" => return Err("--components: an empty name (give e.g. transformer,text_encoder)".into()),
            "vae" => return Err("--components: the vae cannot be compressed (choose from transformer, text_encoder)".into()),
            _ => return Err(format!("--components: unknown component `{name}` (choose from transformer, text_encoder)")),
        };
        if !components.contains(&component) {
            components.push(component);
        }
    }
    Ok(components)
}

//! DF11 expansion on the device against the official dfloat11 package:
//! four groups it wrote (`test_vectors/goldens/df11/synthetic.safetensors`,
//! 59 KiB, built into the binary), each with the bf16 weights it was
//! compressed from, expanded by the `df11_decode` kernel bit for bit.

use super::Check;
use crate::model::df11::Df11DeviceGroup;
use flux_lite_core::df11::{Df11Field, Df11Fields, Df11Group};
use flux_lite_kernels::Gpu;
use safetensors::SafeTensors;

const OFFICIAL: &[u8] = include_bytes!("../../../test_vectors/goldens/df11/synthetic.safetensors");

/// The groups: a near-uniform exponent histogram, codes up to 32 bits, many
/// blocks with every lookup level, and a group of three linears.
const CASES: [&str; 4] = ["near_uniform", "long_codes", "many_blocks", "multi_linear"];

const MEASURE: &str = "weights differing";

/// One check per official group.
pub fn checks(gpu: &Gpu) -> Vec<Check> {
    let file = match SafeTensors::deserialize(OFFICIAL) {
        Ok(f) => f,
        Err(e) => return vec![Check::failed("DF11 expansion on the device", MEASURE, 0.0, format!("the built-in groups: {e}"))],
    };
    CASES.iter().map(|case| check(gpu, &file, case)).collect()
}

fn check(gpu: &Gpu, file: &SafeTensors<'_>, case: &str) -> Check {
    let name = format!("DF11 expansion on the device, official group {case}");
    match expand(gpu, file, case) {
        Ok((got, want)) => {
            let differing = got.len().abs_diff(want.len()) + got.iter().zip(&want).filter(|(a, b)| a != b).count();
            Check::measured(format!("{name} ({} weights)", want.len()), MEASURE, differing as f64, 0.0)
        }
        Err(why) => Check::failed(name, MEASURE, 0.0, why),
    }
}

/// The device's expansion of `case` and the official bf16 words.
fn expand(gpu: &Gpu, file: &SafeTensors<'_>, case: &str) -> Result<(Vec<u16>, Vec<u16>), String> {
    let tensor = |suffix: &str| file.tensor(&format!("{case}.{suffix}")).map(|t| t.data()).map_err(|e| e.to_string());
    let field = |f: Df11Field| tensor(f.name());
    let fields = Df11Fields {
        luts: field(Df11Field::Luts)?,
        encoded_exponent: field(Df11Field::EncodedExponent)?,
        sign_mantissa: field(Df11Field::SignMantissa)?,
        output_positions: field(Df11Field::OutputPositions)?,
        gaps: field(Df11Field::Gaps)?,
        split_positions: field(Df11Field::SplitPositions)?,
    };
    let want: Vec<u16> = tensor("weights")?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    let group = Df11Group::new(fields).map_err(|e| e.to_string())?;
    let on_device = Df11DeviceGroup::upload(gpu, &group);
    let bytes = 2 * want.len() as u64;
    let slot = gpu.storage("selftest df11 slot", bytes);
    let mut decode = Vec::new();
    on_device.record_decode(gpu, &mut decode, &slot, 0).map_err(|e| e.to_string())?;
    gpu.submit(|enc| {
        flux_lite_kernels::encode(enc, &decode);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let back = gpu.read_bytes(&slot, 0, bytes).map_err(|e| e.to_string())?;
    Ok((back.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect(), want))
}
